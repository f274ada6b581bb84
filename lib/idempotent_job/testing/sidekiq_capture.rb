# frozen_string_literal: true

module IdempotentJob
  module Testing
    # Last client middleware of the kit's enqueues: keeps the payload as the client
    # chain made it (through JSON, as a queue stores it) and stops the push, so nothing
    # reaches Redis, the fake queues or an inline run whatever the test mode. Internal.
    class SidekiqCapture
      # @param holder [Array] receives the payload
      def initialize(holder)
        @holder = holder
      end

      # @return [nil] the push is stopped
      def call(_job_class, job, _queue, _redis_pool = nil)
        @holder << JSON.parse(JSON.generate(job)).merge("enqueued_at" => Time.now.to_f)
        nil
      end
    end
  end
end
