# frozen_string_literal: true

module IdempotentJob
  # Every decision the gem makes, published as an event: through
  # ActiveSupport::Notifications as `<name>.idempotent_job` when ActiveSupport is loaded,
  # and always to the subscribers of {IdempotentJob.subscribe}.
  #
  # Names: enqueue_skipped (a producer's push of a completed operation dropped, see
  # {EnqueueCheck}), claimed, completed, skipped, deferred, taken_over, lookup, held, given_up,
  # released, lost_claim, heartbeat_failed, mismatch, purge_batch, result_not_stored, delivered
  # (one per delivery, last: its outcome label or error, door). Payload (a
  # Hash with Symbol keys):
  # job_type, operation_key, jid, attempt where they apply, duration (seconds) for
  # claimed (the claim's round trip) and completed (the body's run), and the event's
  # own details (kind, decision, answer, deleted, total…; heartbeat_failed: failures,
  # error, in_doubt; completed: result_state with store_result; skipped: replayed: true and
  # result_state for a replay; result_not_stored: result_state, reason).
  module Events
    # Event names, in the order a delivery may meet them.
    NAMES = %i[enqueue_skipped claimed taken_over lookup completed skipped deferred held given_up released
               lost_claim heartbeat_failed mismatch purge_batch result_not_stored delivered].freeze
    # ActiveSupport::Notifications names, by event name.
    NOTIFICATION_NAMES = NAMES.to_h { |name| [name, "#{name}.idempotent_job"] }.freeze

    @subscribers = []
    @lock = Mutex.new

    class << self
      # @param names [Array<Symbol>] events to receive; none means all
      # @yieldparam name [Symbol] the event name
      # @yieldparam payload [Hash] the event's payload
      # @return [Object] a handle for {unsubscribe}
      # @raise [ArgumentError] for an unknown event name
      def subscribe(*names, &block)
        raise ArgumentError, "subscribe needs a block" unless block

        unknown = names - NAMES
        raise ArgumentError, "unknown idempotent_job events: #{unknown.inspect} (known: #{NAMES.inspect})" if
          unknown.any?

        handle = [names, block]
        @lock.synchronize { @subscribers += [handle] }
        handle
      end

      # @param handle [Object] what {subscribe} returned
      # @return [void]
      def unsubscribe(handle)
        @lock.synchronize { @subscribers -= [handle] }
      end

      # Whether an event would reach anyone: a subscriber of {subscribe} (to it or to
      # all), or an ActiveSupport::Notifications subscriber to `<name>.idempotent_job`.
      # The protocol builds an event's payload only then.
      # @param name [Symbol] one of {NAMES}
      # @return [Boolean]
      def listened?(name)
        subscribers = @subscribers
        return true if subscribers.any? { |names, _| names.empty? || names.include?(name) }
        return false unless defined?(::ActiveSupport::Notifications)

        ::ActiveSupport::Notifications.notifier.listening?(NOTIFICATION_NAMES.fetch(name) { "#{name}.idempotent_job" })
      end

      # "Class: message" of a subscriber's error, read so that a `message` or class `name`
      # that raises cannot escape {publish} (see {Protocol::Driver.class_name}).
      # @param error [StandardError]
      # @return [String]
      def described(error)
        text = begin
          error.message.to_s
        rescue StandardError => e
          "(its #message raised #{named(e)})"
        end
        "#{named(error)}: #{text}"
      end

      # The class name of `error`, or "an anonymous exception class" for a class with none.
      # @param error [Exception]
      # @return [String]
      def named(error)
        Protocol::Driver.class_name(error) || "an anonymous exception class"
      end

      # Publishes one event. A subscriber that raises is logged and skipped: events
      # never change what a delivery does.
      # @param name [Symbol] one of {NAMES}
      # @param payload [Hash]
      # @return [void]
      def publish(name, payload)
        if defined?(::ActiveSupport::Notifications)
          ::ActiveSupport::Notifications.instrument(NOTIFICATION_NAMES.fetch(name) { "#{name}.idempotent_job" },
                                                    payload)
        end
        @subscribers.each do |names, block|
          next unless names.empty? || names.include?(name)

          begin
            block.call(name, payload)
          rescue StandardError => e
            IdempotentJob.logger.error("idempotent_job: a subscriber to #{name} raised #{described(e)}")
          end
        end
      end
    end
  end
end
