# frozen_string_literal: true

module IdempotentJob
  module Testing
    # The kinds of job the kit can replay, one per door: a kind turns a test's job
    # (a Sidekiq job class, a {PlainJob}…) into payloads and delivers them through its
    # door on the current thread. Doors add their kind with {.register}.
    #
    # A kind is a class answering `handles?(job)`; `new(job, lease:)` gives a subject with:
    # * `name` → String, the job in messages;
    # * `options` → JobOptions, or nil when the job is not protected;
    # * `positional(args)` → Array, the arguments as delivered (`args` Array or Hash by name);
    # * `operation_key(args)` → String or nil (nil: not protected);
    # * `enqueue(args)` → a payload Hash (JSON values), as the queue would deliver it;
    # * `id(payload)` → String, the delivery's id;
    # * `deliver(payload)` → runs one delivery on this thread through the door (without
    #   the gem when {Testing.disabled?}), the body inside {Probe.around}; a copy the door
    #   defers goes to `Recorder.current&.deferred!(payload)`;
    # * `around_scenario { }` → [the block's value, Array of jobs the body enqueued].
    module Subjects
      @kinds = []

      class << self
        # @param kind [Class] answering `handles?(job)` and `new(job, lease:)`
        # @return [void]
        def register(kind)
          @kinds = [kind] + (@kinds - [kind])
        end

        # @param job [Object] what the test names
        # @param lease [Float] the deliveries' lease in seconds
        # @return [Object] its subject
        # @raise [ArgumentError] when no loaded kind handles it
        def for(job, lease:)
          kind = @kinds.find { |k| k.handles?(job) }
          return kind.new(job, lease:) if kind

          raise ArgumentError, "#{job.inspect} is not a job the kit can replay (loaded kinds: " \
                               "#{@kinds.map(&:name).join(", ")}; a plain operation is a Testing::PlainJob)"
        end
      end
    end

    # What the kinds for a job class (a Sidekiq job, an ActiveJob) share: the class and
    # the kit's lease, the name in messages, and the arguments by position. A kind
    # subclasses it and adds the rest of {Subjects}' list.
    class ClassSubject
      # @param job_class [Class] the job class
      # @param lease [Float] the deliveries' lease in seconds
      def initialize(job_class, lease:)
        @job_class = job_class
        @lease = lease
      end

      # @return [String] the class name
      def name
        @job_class.to_s
      end

      # @param args [Array, Hash] positional, or by perform's parameter names
      # @return [Array] the arguments as delivered
      # @raise [ArgumentError] for names perform does not take
      def positional(args)
        Arguments.positional(@job_class, args)
      end
    end
  end
end
