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

      # Publishes an event about a claim.
      # @param name [Symbol] an {Events} name
      # @param claim [Claim]
      # @return [void]
      def emit(name, claim, **details)
        Events.publish(name, { job_type: claim.job_type, operation_key: claim.operation_key, jid: claim.jid,
                               attempt: claim.attempt, **details })
      end

      # Publishes an event about the delivery (no claim).
      # @param name [Symbol] an {Events} name
      # @return [void]
      def emit_delivery(name, **details)
        Events.publish(name, { job_type: @delivery.job_type, operation_key: @delivery.operation_key,
                               jid: @delivery.id, **details })
      end

      %i[info warn error].each do |level|
        # Logs `text` with the gem's prefix.
        # @param text [String]
        # @return [void]
        define_method(level) { |text| logger.public_send(level, "idempotent_job: #{text}") }
      end
    end
  end
end
