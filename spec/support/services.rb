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

  # The URL the suite's own ActiveRecord models connect with: without named prepared
  # statements under the distributed profile's runs (bin/distributed-replay), one of
  # which goes through PgBouncer in transaction mode, where they cannot be kept.
  def self.active_record_url
    return database_url unless ENV["IDEMPOTENT_JOB_COMPATIBILITY"] == "distributed"

    "#{database_url}#{database_url.include?("?") ? "&" : "?"}prepared_statements=false"
  end

  def self.configure_gem!(**settings)
    IdempotentJob.reset!
    IdempotentJob.configure do |c|
      c.database_url = database_url
      c.lease = 30
      c.logger = Logger.new(File::NULL)
      # CI runs the replay scenarios once more with the distributed profile forced on.
      c.compatibility = ENV["IDEMPOTENT_JOB_COMPATIBILITY"] if ENV["IDEMPOTENT_JOB_COMPATIBILITY"]
      settings.each { |name, value| c.public_send("#{name}=", value) }
    end
  end
end

SpecServices.ensure_started!
