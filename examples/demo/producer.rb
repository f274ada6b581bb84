# frozen_string_literal: true

module Demo
  # Enqueues the demo's deliveries with Sidekiq::Client, as an application would.
  class Producer
    def initialize(state)
      @state = state
    end

    # (d), (g) and (i), first half: the deliveries whose worker will be killed; returns once a
    # worker has claimed (d) and (g), sent the receipt of (g) and written the ledger row of (i).
    def crash
      capture = @state.order_id(104)
      email = @state.email
      ledger = @state.ledger_crash
      CaptureOrderJob.perform_async(capture, 4200)
      @state.delivered(CaptureOrderJob, capture)
      EmailReceiptJob.perform_async(email.key, @state.email_address)
      @state.delivered(EmailReceiptJob, email.key)
      LedgerEntryJob.perform_async(ledger.key, 1250)
      @state.delivered(LedgerEntryJob, ledger.key)
      @state.save
      record = claimed(CaptureOrderJob, capture)
      puts "(d) CaptureOrderJob #{capture}: claimed by jid #{record.jid} (attempt #{record.attempts}, " \
           "lease #{record.lease_seconds.round} s); its worker hangs before the effect"
      email_sent(email)
      ledger_written(ledger)
    end

    # Everything else, with the worker idle: (h) first, so that its copies meet the 5 idle
    # threads together, then (b), whose copies meet them again when (h) commits.
    def enqueue
      transactional_copies
      concurrent_copies
      redeliver_after_crash
      redeliver_ledger
      redeliver_email
      repeats
      same_jid
      distinct
      composite
      two_producers
      ActiveJobScenario.enqueue(@state)
      @state.save
    end

    private

    # (h): one LPUSH of 5 copies of a transactional operation; the 5 idle threads take them
    # at the same time. The first claim's transaction holds the record's row lock until it
    # commits; the other copies wait for that commit, then find the operation completed.
    def transactional_copies
      ledger = @state.ledger_copies
      Sidekiq::Client.push_bulk("class" => LedgerEntryJob, "args" => Array.new(5) { [ledger.key, 3100] })
      @state.delivered(LedgerEntryJob, ledger.key, 5)
      puts "(h) LedgerEntryJob #{ledger.key}: 5 copies pushed at once (idempotency_transaction: true)"
    end

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

    # (i), second half: the killed worker's transaction never committed. Once PostgreSQL
    # has ended its backend (and so rolled it back), the producer enqueues the entry again.
    def redeliver_ledger
      ledger = @state.ledger_crash
      seen = Uncommitted.find(ledger.key) or raise "no trace of the killed worker's ledger transaction"
      Demo.wait_for(10, "PostgreSQL backend #{seen["backend"]} to end") { Effects.backend_state(seen["backend"]).nil? }
      rows = Effects.ledger(ledger.key).size
      record = ledger.record
      puts "(i) LedgerEntryJob #{ledger.key}: backend #{seen["backend"]} of the killed worker is gone, its " \
           "transaction rolled back: #{rows} ledger row#{"s" unless rows == 1}, " \
           "#{record ? "record #{record.status}" : "no record"}; enqueued again"
      LedgerEntryJob.perform_async(ledger.key, 1250)
      @state.delivered(LedgerEntryJob, ledger.key)
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

    # (a): the producer enqueues the same operation 3 times (new jids), 2 s apart: after
    # the first has completed, as a resubmitted form or a rerun schedule would.
    def repeats
      order = @state.order_id(101)
      3.times { |i| ChargeOrderJob.perform_in(2 * i, order, 1500) }
      @state.delivered(ChargeOrderJob, order, 3)
      puts "(a) ChargeOrderJob #{order}: enqueued 3 times, 2 s apart"
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

    # (j): the same charge enqueued by two producers: the orders controller, then the payment
    # provider's webhook a few seconds later.
    def two_producers
      order = @state.order_id(111)
      OrdersController.new.create(order)
      StripeWebhook.new.handle(order)
      @state.delivered(ChargeOrderJob, order, 2)
      puts "(j) ChargeOrderJob #{order}: enqueued by OrdersController#create, and by StripeWebhook#handle " \
           "#{StripeWebhook::NOTICE_DELAY} s later"
    end

    # (g): waits until the receipt went out while its worker still holds the claim.
    def email_sent(email)
      sent = Demo.wait_for(20, "the receipt of #{email.id} to be sent") { Effects.emails(email.key).first }
      record = claimed(EmailReceiptJob, email.key)
      puts "(g) EmailReceiptJob #{email.key}: claimed by jid #{record.jid} (attempt #{record.attempts}, " \
           "lease #{record.lease_seconds.round} s, idempotency_on_stale: :hold); its worker (pid #{sent["pid"]}) " \
           "sent the receipt and hangs before recording the completion"
    end

    # (i): waits until the worker has written its ledger row inside its open transaction,
    # then compares what that transaction saw with what everyone else sees.
    def ledger_written(ledger)
      seen = Demo.wait_for(20, "the ledger row of #{ledger.key} to be written") { Uncommitted.find(ledger.key) }
      state = Effects.backend_state(seen["backend"])
      rows = Effects.ledger(ledger.key).size
      record = ledger.record
      puts "(i) LedgerEntryJob #{ledger.key}: its worker (pid #{seen["pid"]}, PostgreSQL backend " \
           "#{seen["backend"]}, #{state}) wrote its row and hangs before commit; inside its transaction: " \
           "#{seen["rows"]} row, record #{seen["status"]}; outside: #{rows} rows, " \
           "#{record ? "record #{record.status}" : "no record"}"
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
