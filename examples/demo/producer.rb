# frozen_string_literal: true

module Demo
  # Enqueues the demo's deliveries with Sidekiq::Client, as an application would.
  class Producer
    def initialize(state)
      @state = state
    end

    # (d) and (g), first half: the deliveries whose worker will be killed; returns once a
    # worker has claimed both operations and sent the receipt of (g).
    def crash
      capture = @state.order_id(104)
      email = @state.email
      CaptureOrderJob.perform_async(capture, 4200)
      @state.delivered(CaptureOrderJob, capture)
      EmailReceiptJob.perform_async(email.key, @state.email_address)
      @state.delivered(EmailReceiptJob, email.key)
      @state.save
      record = claimed(CaptureOrderJob, capture)
      puts "(d) CaptureOrderJob #{capture}: claimed by jid #{record.jid} (attempt #{record.attempts}, " \
           "lease #{record.lease_seconds.round} s); its worker hangs before the effect"
      email_sent(email)
    end

    # Everything else, with the worker idle: (b) first, so that its copies meet idle threads.
    def enqueue
      concurrent_copies
      redeliver_after_crash
      redeliver_email
      repeats
      same_jid
      distinct
      composite
      @state.save
    end

    private

    # (b): one LPUSH of 5 copies; the worker's 5 idle threads take them at the same time.
    def concurrent_copies
      order = @state.order_id(102)
      Sidekiq::Client.push_bulk("class" => ChargeOrderJob, "args" => Array.new(5) { [order, 2500] })
      @state.delivered(ChargeOrderJob, order, 5)
      puts "(b) ChargeOrderJob #{order}: 5 copies pushed at once"
    end

    # (d), second half: Sidekiq OSS loses the job of a SIGKILLed worker, so the producer
    # enqueues the operation again, as it would after noticing that it did not complete.
    def redeliver_after_crash
      order = @state.order_id(104)
      CaptureOrderJob.perform_async(order, 4200)
      @state.delivered(CaptureOrderJob, order)
      record = IdempotentJob.record("CaptureOrderJob", order)
      puts "(d) CaptureOrderJob #{order}: enqueued again; the record is still #{record.status} by the killed " \
           "worker, whose lease #{lease_text(record)}"
    end

    # (g), second half: the same for the receipt; the record cannot tell whether it went out.
    def redeliver_email
      email = @state.email
      EmailReceiptJob.perform_async(email.key, @state.email_address)
      @state.delivered(EmailReceiptJob, email.key)
      record = email.record
      puts "(g) EmailReceiptJob #{email.key}: enqueued again; the record is still #{record.status} by the killed " \
           "worker, whose lease #{lease_text(record)}; whether the receipt went out, the record cannot tell"
    end

    # (a): the producer enqueues the same operation 3 times (new jids).
    def repeats
      order = @state.order_id(101)
      3.times { ChargeOrderJob.perform_async(order, 1500) }
      @state.delivered(ChargeOrderJob, order, 3)
      puts "(a) ChargeOrderJob #{order}: enqueued 3 times"
    end

    # (c): the identical payload (same jid) delivered twice, as a retry or a queue's redelivery would.
    def same_jid
      order = @state.order_id(103)
      payload = { "class" => ChargeOrderJob, "args" => [order, 990], "jid" => SecureRandom.hex(12) }
      2.times { Sidekiq::Client.push(payload.dup) }
      @state.delivered(ChargeOrderJob, order, 2)
      puts "(c) ChargeOrderJob #{order}: one payload pushed twice, jid #{payload["jid"]}"
    end

    # (e): distinct operations, each delivered once.
    def distinct
      keys = [105, 106, 107].map { |n| @state.order_id(n) }
      keys.each do |order|
        ChargeOrderJob.perform_async(order, 700)
        @state.delivered(ChargeOrderJob, order)
      end
      puts "(e) ChargeOrderJob #{keys.join(", ")}: enqueued once each"
    end

    # (f): two deliveries whose Hash argument differs only in key order: the same operation.
    def composite
      order = @state.order_id(105)
      ShipParcelJob.perform_async({ "order_id" => order, "parcels" => 2 }, "ups")
      ShipParcelJob.perform_async({ "parcels" => 2, "order_id" => order }, "ups")
      @state.delivered(ShipParcelJob, @state.shipment.key, 2)
      puts "(f) ShipParcelJob #{order} via ups: enqueued twice, the Hash argument's keys in another order"
    end

    # (g): waits until the receipt went out while its worker still holds the claim.
    def email_sent(email)
      sent = Demo.wait_for(20, "the receipt of #{email.id} to be sent") { Effects.emails(email.key).first }
      record = claimed(EmailReceiptJob, email.key)
      puts "(g) EmailReceiptJob #{email.key}: claimed by jid #{record.jid} (attempt #{record.attempts}, " \
           "lease #{record.lease_seconds.round} s, idempotency_on_stale: :hold); its worker (pid #{sent["pid"]}) " \
           "sent the receipt and hangs before recording the completion"
    end

    # Waits until a worker holds the operation's claim.
    # @return [IdempotentJob::Record]
    def claimed(job_class, key)
      Demo.wait_for(20, "#{job_class} #{key} to be claimed") do
        found = IdempotentJob.record(job_class.name, key)
        found if found&.status == :claimed
      end
    end

    def lease_text(record)
      record.lease_expired ? "has run out" : "ends at #{record.lease_expires_at.strftime("%T")}"
    end
  end
end
