# frozen_string_literal: true

require "English"

# The real services the suite runs against. bin/test exports DATABASE_URL and
# REDIS_URL; when they are unset (a bare `rspec`), bin/services starts a throwaway
# PostgreSQL and Redis on loopback under tmp/services.
module SpecServices
  ROOT = File.expand_path("../..", __dir__)

  def self.ensure_started!
    return if ENV["DATABASE_URL"] && ENV["REDIS_URL"]

    exports = `#{ROOT}/bin/services start #{ROOT}/tmp/services`
    raise "bin/services could not start PostgreSQL and Redis" unless $CHILD_STATUS.success?

    exports.scan(/^export (\w+)=(.*)$/) { |name, value| ENV[name] = value }
  end

  def self.database_url
    ENV.fetch("DATABASE_URL")
  end

  def self.configure_gem!(**settings)
    IdempotentJob.reset!
    IdempotentJob.configure do |c|
      c.database_url = database_url
      c.lease = 30
      c.logger = Logger.new(File::NULL)
      settings.each { |name, value| c.public_send("#{name}=", value) }
    end
  end
end

SpecServices.ensure_started!
