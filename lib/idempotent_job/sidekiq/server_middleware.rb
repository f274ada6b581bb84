# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Server middleware: runs each delivery of a job that declares `idempotency_key`
    # through the claim protocol ({IdempotentJob::Protocol}: what runs, what does not,
    # the stale policy, the heartbeat) before its body. In Sidekiq's words: a delivery
    # that meets a live claim is pushed back as a scheduled copy (1 s, then doubling
    # with each deferral, never later than that lease's end), a body that raises goes
    # to Sidekiq's retry after its claim is released, and on Sidekiq::Shutdown the
    # claim is kept for the lease to decide.
    #
    # A payload from Sidekiq's ActiveJob adapter (the `wrapped` key) is left to the
    # ActiveJob door, which claims it once under the ActiveJob class; declaring
    # `sidekiq_options idempotency_key` on such a class is refused (ConfigurationError).
    # Reads and writes `idempotent_job_records`.
    class ServerMiddleware
      # @param job_instance [Object] the job object Sidekiq built
      # @param job_hash [Hash] the job payload ("class", "args", "jid", options…)
      # @param _queue [String] queue name
      # @yield runs the rest of the chain and the job body
      # @return [Object] the block's value, or nil when the delivery was not run
      # @raise [OperationKeyError] when the arguments yield no operation key (body not run)
      # @raise [ConfigurationError] for bad options, an `idempotency_*` key in the payload
      #   that no option has (naming the nearest), or an idempotency_key on an ActiveJob class
      # @raise [ConnectionError, DatabaseError] when the claim cannot be decided (body not run)
      # @raise [PayloadMismatchError] for a mismatched payload under `on_mismatch: :raise`
      # @raise [LookupError] when the stale-claim lookup fails (body not run)
      # @raise [LostClaimError] when the body ran but its claim had been taken over
      def call(job_instance, job_hash, _queue, &)
        # A payload pushed by name (`Client.push("class" => "X", ...)`, another
        # language's producer) never met the client middleware: an unknown
        # `idempotency_*` key fails here, into Sidekiq's retry, not a default applied.
        JobOptions.check_payload!(job_instance.class.to_s, job_hash, Options::KNOWN_HASH_KEYS)
        return Wrapped.check!(job_hash, &) if Compat.active_job?(job_hash)

        options = Options.resolve(job_instance.class, job_hash)
        return yield unless options

        job_instance.class.include(IdempotentJob::Job) unless job_instance.is_a?(IdempotentJob::Job)
        Protocol.new(options, door: door_for(job_hash)).run(delivery(options, job_hash), host: job_instance, &).value
      rescue OperationKeyError, ConfigurationError => e
        Unwritable.keep(job_hash, e) # a refusal Sidekiq's retry could not write back is dead-lettered
        raise
      end

      private

      # The door of one delivery (the testing kit's subclass keeps deferred copies).
      def door_for(job_hash)
        Door.new(job_hash)
      end

      # The attempt's facts, timestamps in seconds whatever the Sidekiq version.
      def delivery(options, job_hash)
        args = job_hash["args"]
        # The key is checked by the core's one call (`Native::Protocol#perform`).
        Delivery.queued(options, operation_key: options.key.operation_key(args, job_type: options.scope), payload: args,
                                 job_class: job_hash["class"], queue: job_hash["queue"], id: job_hash["jid"],
                                 deferrals: job_hash[Door::DEFERRALS], producer: job_hash[Producer::KEY],
                                 facts: { "jid" => job_hash["jid"], "retry_count" => job_hash["retry_count"],
                                          "enqueued_at" => Compat.seconds(job_hash["enqueued_at"]),
                                          "created_at" => Compat.seconds(job_hash["created_at"]) })
      end
    end
  end
end
