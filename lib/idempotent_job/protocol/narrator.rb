# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Says the core's log lines about one delivery through the door's logger (the core
    # words them: job type, operation key, delivery id). Internal.
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

      # Logs `text` at `level` with the gem's prefix. A ::Logger swallows any exception
      # raised while it writes (`rescue Exception` in its device), so an interrupt that
      # arrives meanwhile (a signal, Thread#raise, Timeout) is held until the line is
      # written and raised then, instead of being lost.
      # @param level [Symbol] :info, :warn or :error
      # @param text [String]
      # @return [void]
      def say(level, text)
        out = @door.logger
        if out.is_a?(::Logger)
          return Thread.handle_interrupt(Object => :never) { out.public_send(level) { "idempotent_job: #{text}" } }
        end

        out.public_send(level, "idempotent_job: #{text}")
      end
    end
  end
end
