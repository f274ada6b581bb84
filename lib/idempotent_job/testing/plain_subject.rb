# frozen_string_literal: true

module IdempotentJob
  # See lib/idempotent_job/testing.rb.
  module Testing
    # The kit's kind for a {PlainJob}: each delivery is one {IdempotentJob.perform_once}
    # call; an :in_progress outcome is deferred as the consumer would (a copy with one
    # more deferral). See {Subjects}.
    class PlainSubject
      # @return [Boolean] for a {PlainJob}
      def self.handles?(job)
        job.is_a?(PlainJob)
      end

      # @param job [PlainJob]
      # @param lease [Float] seconds
      def initialize(job, lease:)
        @job = job
        @lease = lease
      end

      # @return [String]
      def name
        @job.job_type
      end

      # @return [JobOptions]
      def options
        @options ||= JobOptions.cached(@job.job_type, { lease: @lease, **@job.options })
      end

      # @param args [Array]
      # @return [Array]
      # @raise [ArgumentError] for arguments by name (a plain body has no parameter names)
      def positional(args)
        raise ArgumentError, "#{name}: a PlainJob takes positional arguments, got #{args.inspect}" unless
          args.is_a?(Array)

        args.dup
      end

      # @param args [Array]
      # @return [String]
      def operation_key(args)
        Key.value_key(JSON.parse(JSON.generate(args))[@job.key], name)
      end

      # @param args [Array]
      # @return [Hash] {"id", "args", "deferrals"}
      def enqueue(args)
        { "id" => SecureRandom.hex(12), "args" => JSON.parse(JSON.generate(args)), "deferrals" => 0 }
      end

      # @return [String]
      def id(payload)
        payload["id"]
      end

      # @param payload [Hash] from {#enqueue}
      # @return [Object] the body's value (nil when not run)
      def deliver(payload)
        args = payload["args"]
        return Probe.around { @job.body.call(*args) } if Testing.disabled?

        outcome = IdempotentJob.perform_once(name, args[@job.key], lease: @lease, payload: args, id: payload["id"],
                                                                   deferrals: payload["deferrals"], **@job.options) do
          Probe.around { @job.body.call(*args) }
        end
        Recorder.current&.deferred!(payload.merge("deferrals" => payload["deferrals"].to_i + 1)) if
          outcome.in_progress?
        outcome.value
      end

      # @return [Array(Object, Array)] the block's value, nothing enqueued
      def around_scenario
        [yield, []]
      end
    end

    Subjects.register(PlainSubject)
  end
end
