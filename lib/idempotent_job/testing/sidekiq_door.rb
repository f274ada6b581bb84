# frozen_string_literal: true

module IdempotentJob
  module Testing
    # The Sidekiq door as the kit's deliveries use it: a deferred copy goes to the
    # delivery's recorder instead of Redis or the fake queues, and is deferred even
    # inside a user's `Sidekiq::Testing.inline!` block. Internal to the kit.
    class SidekiqDoor < IdempotentJob::Sidekiq::Door
      # @return [false] the kit keeps copies itself
      def inline?
        false
      end

      # @param payload [Hash] the deferred copy
      # @return [String] its jid
      def push(payload)
        Recorder.current&.deferred!(JSON.parse(JSON.generate(payload)))
        payload["jid"]
      end
    end
  end
end
