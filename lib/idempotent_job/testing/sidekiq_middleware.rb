# frozen_string_literal: true

module IdempotentJob
  module Testing
    # The gem's server middleware in the kit's chains, with {SidekiqDoor}. Internal.
    class SidekiqMiddleware < IdempotentJob::Sidekiq::ServerMiddleware
      private

      def door_for(job_hash)
        SidekiqDoor.new(job_hash)
      end
    end
  end
end
