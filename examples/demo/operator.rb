# frozen_string_literal: true

require "time"

module Demo
  # (g): what a person does about the held EmailReceiptJob operation. The demo's shell
  # script lists held operations and settles this one with the gem's rake tasks; this
  # class waits for the hold and does the person's check in between.
  class Operator
    HOLD_TIMEOUT = 30

    def initialize(state)
      @state = state
      @operation = state.email
    end

    # Waits until the redelivery has taken over the stale claim and held the operation.
    # @return [Boolean] false when it was not held in time
    def wait_held
      record = Demo.wait_for(HOLD_TIMEOUT, "#{@operation.id} to be held") do
        found = @operation.record
        found if found&.status == :held
      end
      puts "(g) #{@operation.id}: the redelivery (jid #{record.jid}) took over the stale claim " \
           "(attempt #{record.attempts}) and held the operation instead of running the body again"
      true
    rescue Timeout::Error => e
      warn "FAILED: #{e.message} (status: #{@operation.record&.status.inspect})"
      false
    end

    # The check a person makes before settling: did the receipt go out? Here the mail log
    # is the demo_emails table; in an application, the mail provider's log.
    # @param killed_pid [Integer, nil] the worker the demo SIGKILLed
    # @return [Boolean] true when exactly one receipt was sent, by the killed worker
    def check_email(killed_pid)
      sent = Effects.emails(@operation.key)
      by = sent.map { |row| "pid #{row.fetch("pid")} at #{Time.parse(row.fetch("created_at")).strftime("%T")}" }
      puts "(g) a person checks the mail log (demo_emails) for #{@operation.key}: " \
           "#{sent.size} receipt#{"s" unless sent.size == 1} sent#{" (#{by.join(", ")})" unless by.empty?}"
      if sent.size == 1 && (killed_pid.nil? || sent.first.fetch("pid").to_i == killed_pid)
        puts "(g) it went out from the killed worker before it died: resolved as done, so it is not sent twice"
        return true
      end
      warn "FAILED: expected one receipt sent by the killed worker (pid #{killed_pid}); not resolving it"
      false
    end
  end
end
