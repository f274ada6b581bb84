# frozen_string_literal: true

$LOAD_PATH.unshift File.expand_path("../lib", __dir__)

require_relative "support/services"
require "sidekiq"
require "timeout"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job"
require "idempotent_job/sidekiq"
# Sidekiq's testing API: `require "sidekiq/testing"` before 8.1, `Sidekiq.testing!(:fake)`
# from 8.1 (which deprecates the require).
require "idempotent_job/testing/sidekiq_compat"
IdempotentJob::Testing::SidekiqCompat.load_testing!
require_relative "support/effects"
require_relative "support/jobs"
require_relative "support/processes"
require_relative "support/store_helpers"
require_relative "support/record_rows"
require_relative "support/replay_helpers"
require_relative "support/transactional_jobs"
require_relative "support/gc_stress"

Sidekiq.logger.level = Logger::WARN
Sidekiq::Testing.fake!

RSpec.configure do |config|
  config.disable_monkey_patching!
  config.order = :defined
  config.filter_run_when_matching :focus
  config.example_status_persistence_file_path = "tmp/rspec-status.txt"

  # A hang becomes a failure (native calls release the GVL, so Timeout reaches them),
  # never a CI run that waits forever.
  config.around do |example|
    Timeout.timeout(Float(ENV.fetch("SPEC_EXAMPLE_TIMEOUT", "240"))) { example.run }
  end

  config.before(:suite) do
    SpecServices.configure_gem!
    IdempotentJob.migrate!
    Effects.create_table!
    SpecPayment.setup!
  end

  config.before do
    SpecServices.configure_gem!
    Effects.reset!
    SpecHooks.reset!
    Sidekiq::Job.clear_all
    Sidekiq::Testing.server_middleware(&:clear)
    Sidekiq::Testing.server_middleware { |chain| chain.add IdempotentJob::Sidekiq::ServerMiddleware }
  end
end
