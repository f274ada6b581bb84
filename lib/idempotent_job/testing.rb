# frozen_string_literal: true

require "idempotent_job"
begin
  require "sidekiq"
rescue LoadError
  nil # the kit without Sidekiq: plain operations (and doors that register a kind)
end
if defined?(Sidekiq::VERSION)
  require "idempotent_job/sidekiq"
  require "idempotent_job/testing/sidekiq_compat"
  IdempotentJob::Testing::SidekiqCompat.load_testing!
end

module IdempotentJob
  # A replay testing kit: run your own Sidekiq job through the deliveries a real queue
  # makes (the same message several times, concurrent workers, a worker SIGKILLed after
  # its claim or after its effect, then redeliveries before and after the lease) and
  # check that its effect happened once, or as its stale policy allows.
  #
  #   require "idempotent_job/testing"   # opt-in; also defines the RSpec matchers
  #
  #   IdempotentJob::Testing.setup!      # DATABASE_URL, or a throwaway PostgreSQL
  #   expect(ChargeOrderJob).to be_idempotent_for(order_id: 42, amount_cents: 1500)
  #     .with_effect { Charge.count }   # counts every operation's effect (distinct needs both)
  #
  # Deliveries go through the job's door against the real database: a Sidekiq job
  # through its server middleware chain (`Sidekiq::Testing.server_middleware` plus the
  # gem's middleware), a {PlainJob} through {IdempotentJob.perform_once}. No Sidekiq
  # test mode is set or nested, so the kit works inside a test's own
  # `Sidekiq::Testing.inline! do … end` or `fake! do … end` (Sidekiq 7.2+ refuses
  # nesting). With Sidekiq installed, requiring this file loads Sidekiq's testing API
  # (`sidekiq/testing`, or `Sidekiq.testing!(:fake)` on 8.1+), which turns fake mode on
  # unless your suite chose another.
  module Testing
    # Lease in seconds given to the deliveries the kit makes, so that scenarios which
    # wait for a lease to end take a few seconds (long enough for a loaded CI machine).
    DEFAULT_LEASE = 2.0
    # Environment variable that runs every scenario with the gem's middleware removed
    # (`IDEMPOTENT_JOB_TESTING_DISABLED=1 rspec`): your tests should then fail.
    DISABLE_ENV = "IDEMPOTENT_JOB_TESTING_DISABLED"

    class << self
      # @return [Float] the kit's lease in seconds (default {DEFAULT_LEASE})
      def lease
        @lease || DEFAULT_LEASE
      end

      # @param seconds [Numeric] a positive lease, in seconds, for the kit's deliveries
      # @raise [ConfigurationError] for a non-positive value
      def lease=(seconds)
        @lease = Native.check_duration("testing kit: IdempotentJob::Testing.lease", seconds)
      end

      # @return [Boolean] whether scenarios run without the gem's middleware: set by
      #   {disabled=}, {without_gem}, or the environment variable {DISABLE_ENV}
      def disabled?
        return @disabled unless @disabled.nil?

        %w[1 true yes].include?(ENV.fetch(DISABLE_ENV, "").downcase)
      end

      # @param value [Boolean, nil] true to run scenarios unprotected; nil to follow
      #   the environment variable again
      def disabled=(value)
        @disabled = value
        @disabled_by = value ? "IdempotentJob::Testing.disabled = true" : nil
      end

      # @return [String, nil] what disabled the gem for the kit, for failure messages
      def disabled_by
        return nil unless disabled?

        @disabled_by || "#{DISABLE_ENV}=#{ENV.fetch(DISABLE_ENV, nil)}"
      end

      # Runs the block with the gem's middleware removed from the kit's deliveries.
      # @return [Object] the block's value
      def without_gem
        before = [@disabled, @disabled_by]
        @disabled = true
        @disabled_by = "IdempotentJob::Testing.without_gem"
        yield
      ensure
        @disabled, @disabled_by = before
      end

      # Configures the gem for a test suite and creates its table.
      # Uses `database_url`, else ENV["DATABASE_URL"], else starts a throwaway
      # PostgreSQL ({Database.start}; stopped at exit). The gem's decision log goes
      # nowhere unless a `logger:` is given (the scenarios' results say what happened).
      # @param database_url [String, nil] a libpq URL
      # @param settings [Hash] further {IdempotentJob.configure} settings
      # @return [String] the database URL in use
      # @raise [ConfigurationError] for bad settings, or when no PostgreSQL can be started
      # @raise [ConnectionError, MigrationError] when the table cannot be created
      def setup!(database_url: ENV.fetch("DATABASE_URL", nil), **settings)
        url = database_url || (@database ||= Database.start).url
        IdempotentJob.configure(database_url: url, logger: Logger.new(File::NULL), **settings)
        IdempotentJob.migrate!
        url
      end

      # Deletes idempotency records, e.g. between examples
      # (`config.before { IdempotentJob::Testing.clean_records! }`).
      # @param job_type [String, Class, nil] only this job type (scope); nil for all
      # @return [Integer] records deleted
      # @raise [ConnectionError, DatabaseError]
      def clean_records!(job_type = nil)
        sql = "DELETE FROM idempotent_job_records"
        return delete(sql, []) if job_type.nil?

        delete("#{sql} WHERE job_type = $1", [job_type.to_s])
      end

      # Deletes one operation's idempotency record, if any.
      # @param job_type [String, Class] the job type (scope)
      # @param operation_key [String, Integer] the operation key
      # @return [Integer] records deleted (0 or 1)
      # @raise [ConnectionError, DatabaseError]
      def forget(job_type, operation_key)
        delete("DELETE FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
               [job_type.to_s, operation_key.to_s])
      end

      # A replay of one operation of a job class; see {Replay}.
      # @param job_class [Class] a Sidekiq job class
      # @param args [Array, Hash] perform's arguments, positional or by parameter name
      # @param options [Hash] `effect:`, `effect_at:`, `lease:` (seconds), as {Replay#initialize}
      # @return [Replay]
      # @raise [ArgumentError] as {Replay#initialize}
      def replay(job_class, args, **options)
        Replay.new(job_class, args, **options)
      end

      private

      def delete(sql, params)
        Transactional::Native.within { |tx| tx.handle.exec(sql, params) }
      end
    end
  end
end

require "idempotent_job/testing/database"
require "idempotent_job/testing/probe"
require "idempotent_job/testing/subjects"
require "idempotent_job/testing/plain_job"
require "idempotent_job/testing/plain_subject"
if defined?(Sidekiq::VERSION)
  require "idempotent_job/testing/fake_queues"
  require "idempotent_job/testing/sidekiq_capture"
  require "idempotent_job/testing/sidekiq_door"
  require "idempotent_job/testing/sidekiq_middleware"
  require "idempotent_job/testing/sidekiq_subject"
end
# The ActiveJob kind, when the ActiveJob door was required first (it requires the
# kind itself when the kit comes first).
require "idempotent_job/testing/active_job_subject" if defined?(IdempotentJob::ActiveJobDoor::Performer)
require "idempotent_job/testing/replay"
require "idempotent_job/testing/rspec" if defined?(RSpec.configure)
