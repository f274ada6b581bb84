# frozen_string_literal: true

# A door's constant named without its require: the NameError says which require to add.
module IdempotentJob
  # The doors and tools loaded by a require of their own, by constant name: a reference to
  # one not required names the line to add ({.const_missing}).
  OPTIONAL_PARTS = {
    ActiveJob: ["the ActiveJob door", "idempotent_job/active_job", "config/initializers/idempotent_job.rb"],
    Sidekiq: ["the Sidekiq door", "idempotent_job/sidekiq",
              "config/initializers/idempotent_job.rb or your Sidekiq boot file"],
    Web: ["the web page", "idempotent_job/web", "config/routes.rb"],
    Testing: ["the testing kit", "idempotent_job/testing", "spec/spec_helper.rb"]
  }.freeze

  # A door's constant used without its require (`include IdempotentJob::ActiveJob` in a
  # job file loaded before any `require "idempotent_job/active_job"`) raises the usual
  # NameError, naming the require to add; any other name is Ruby's own NameError.
  # @param name [Symbol] the missing constant
  # @raise [NameError]
  def self.const_missing(name)
    part, path, where = OPTIONAL_PARTS[name]
    return super unless part

    raise NameError.new("uninitialized constant #{self}::#{name}: #{part} is loaded by `require \"#{path}\"` " \
                        "(e.g. in #{where})", name, receiver: self)
  end
end
