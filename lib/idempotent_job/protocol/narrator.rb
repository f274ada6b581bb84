# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Says what the protocol decided about one delivery: log lines through the door's
    # logger (naming the job type, operation key and delivery id) and {Events}. Internal.
    class Narrator
      # @return [Door] the door of the delivery
      attr_reader :door
      # @return [Delivery] the delivery narrated
      attr_reader :delivery

      # @param door [Door]
      # @param delivery [Delivery]
      def initialize(door, delivery)
        @door = door
        @delivery = delivery
      end

      # @return [Logger] the door's logger
      def logger
        @door.logger
      end

      # @return [String] e.g. `ChargeOrderJob operation "42" (jid abc)`
      def describe
        "#{@delivery.job_type} operation #{@delivery.operation_key.inspect} (#{@door.id_label} #{@delivery.id})"
      end

      # @param claim [Claim]
      # @return [String] e.g. `ChargeOrderJob operation "42" (jid abc, attempt 2)`
      def describe_claim(claim)
        "#{claim.job_type} operation #{claim.operation_key.inspect} (#{@door.id_label} #{claim.jid}, " \
          "attempt #{claim.attempt})"
      end

      # Publishes an event about a claim (nothing is built when nobody listens: see
      # {Events.listened?}).
      # @param name [Symbol] an {Events} name
      # @param claim [Claim]
      # @return [void]
      def emit(name, claim, **details)
        return unless Events.listened?(name)

        Events.publish(name, { job_type: claim.job_type, operation_key: claim.operation_key, jid: claim.jid,
                               attempt: claim.attempt, **details })
      end

      # Publishes an event about the delivery (no claim); nothing is built when nobody listens.
      # @param name [Symbol] an {Events} name
      # @return [void]
      def emit_delivery(name, **details)
        return unless Events.listened?(name)

        Events.publish(name, { job_type: @delivery.job_type, operation_key: @delivery.operation_key,
                               jid: @delivery.id, **details })
      end

      # Logs a line at info level with the gem's prefix.
      # @param text [String, nil] the line; nil: the block's value, built only when a
      #   `::Logger` (Ruby's, Sidekiq's, Rails') writes it at this level
      # @yieldreturn [String] the line
      # @return [void]
      def info(text = nil, &) = log(:info, text, &)

      # Logs a line at warn level (see {#info}).
      # @param text [String, nil]
      # @return [void]
      def warn(text = nil, &) = log(:warn, text, &)

      # Logs a line at error level (see {#info}).
      # @param text [String, nil]
      # @return [void]
      def error(text = nil, &) = log(:error, text, &)

      # Logs a line at `level` (see {#info}).
      # @param level [Symbol] :info, :warn or :error
      # @param text [String]
      # @return [void]
      def say(level, text) = log(level, text)

      private

      def log(level, text)
        out = logger
        # A ::Logger takes the line as a block and calls it only when it writes it.
        return out.public_send(level) { "idempotent_job: #{text || yield}" } if out.is_a?(::Logger)

        out.public_send(level, "idempotent_job: #{text || yield}")
      end
    end
  end
end
