# frozen_string_literal: true

require "spec_helper"

# ActiveRecord mode queues a repeat's bookkeeping inside the delivery's native call,
# before ActiveRecord commits (issue 30). When the transaction then rolls back after the
# call (an ActiveSupport::Notifications subscriber of `delivered` raising; also the door's
# logger or a deferral that cannot be pushed; or a COMMIT that fails), the claim
# statement's counting is rolled back, and so must the `repeat_facts` entry be: the
# entry carries the claim's transaction id and the bookkeeping writes it only once that
# transaction committed, dropping it when it rolled back (docs/design.md, "Repeat
# bookkeeping"). Before that fix both examples failed with one facts entry written.
RSpec.describe "ActiveRecord mode: a repeat whose transaction rolls back after the native call" do
  let(:payment) { "pay-ar-rollback" }

  def counts
    Effects.connection.exec_params(
      "SELECT duplicates, jsonb_array_length(repeat_facts) AS facts
         FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
      ["RecordPaymentArJob", payment]
    ).first.transform_values(&:to_i)
  end

  it "writes no repeat facts for a duplicate whose claim was rolled back" do
    job = job_hash([payment, 500], klass: RecordPaymentArJob)
    deliver(job)
    subscriber = ActiveSupport::Notifications.subscribe("delivered.idempotent_job") { raise "subscriber down" }
    begin
      expect { deliver(job) }.to raise_error(RuntimeError, /subscriber down/)
    ensure
      ActiveSupport::Notifications.unsubscribe(subscriber)
    end
    IdempotentJob.record("RecordPaymentArJob", payment) # writes this process's queued bookkeeping first
    expect(counts).to eq("duplicates" => 0, "facts" => 0)
  end

  it "writes the repeat facts of a duplicate whose transaction committed" do
    job = job_hash([payment, 500], klass: RecordPaymentArJob)
    2.times { deliver(job) }
    IdempotentJob.record("RecordPaymentArJob", payment)
    expect(counts).to eq("duplicates" => 1, "facts" => 1)
  end

  describe "a COMMIT that fails" do
    let(:trigger) { "ar_rollback_#{SecureRandom.hex(4)}" }

    after do
      Effects.connection.exec("DROP TRIGGER IF EXISTS #{trigger} ON idempotent_job_records")
      Effects.connection.exec("DROP FUNCTION IF EXISTS #{trigger}()")
    end

    # A deferred constraint trigger checks at COMMIT and fails it with a serialization
    # failure (40001), as a serializable transaction's COMMIT can: ActiveRecord's COMMIT
    # raises after the native call queued the entry, and PostgreSQL rolls the
    # transaction back.
    it "writes no repeat facts for a duplicate whose commit failed" do
      job = job_hash([payment, 500], klass: RecordPaymentArJob)
      deliver(job)
      Effects.connection.exec(<<~SQL)
        CREATE FUNCTION #{trigger}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.duplicates > OLD.duplicates THEN
            RAISE EXCEPTION 'could not serialize access (at commit)' USING ERRCODE = '40001';
          END IF;
          RETURN NULL;
        END $$
      SQL
      Effects.connection.exec(<<~SQL)
        CREATE CONSTRAINT TRIGGER #{trigger} AFTER UPDATE ON idempotent_job_records
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
          WHEN (NEW.operation_key = '#{payment}') EXECUTE FUNCTION #{trigger}()
      SQL
      expect { deliver(job) }.to raise_error(/could not serialize access \(at commit\)/)
      IdempotentJob.record("RecordPaymentArJob", payment)
      expect(counts).to eq("duplicates" => 0, "facts" => 0)
    end
  end

  # `transaction: :active_record` inside an outer ActiveRecord transaction joins it (the
  # session is not the outermost: it queues no repeat bookkeeping, as the outer
  # transaction may still roll the claim back). Here the delivery runs in a savepoint
  # (`requires_new: true`) that is rolled back while the outer transaction commits: the
  # claim statement's counting is undone with the savepoint, and nothing else may count
  # a repeat or an attempt for a body that never committed.
  describe "inside an outer transaction, in a savepoint (requires_new: true) that is rolled back" do
    let(:job_type) { "SavepointArJob" }
    let(:key) { "sp-#{SecureRandom.hex(4)}" }

    def bookkeeping
      IdempotentJob.record(job_type, key) # writes this process's queued bookkeeping first
      Effects.connection.exec_params(
        "SELECT status, attempts, duplicates, cardinality(repeat_times) AS repeats,
                jsonb_array_length(repeat_facts) AS facts
           FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
        [job_type, key]
      ).first&.then { |row| row.to_h { |k, v| [k, k == "status" ? v : v.to_i] } }
    end

    def in_rolled_back_savepoint
      ActiveRecord::Base.transaction do
        ActiveRecord::Base.transaction(requires_new: true) do
          yield
          raise ActiveRecord::Rollback
        end
      end
    end

    def deliver_once(&)
      IdempotentJob.perform_once(job_type, key, transaction: :active_record, &)
    end

    it "leaves no record for a first claim; the next delivery is a first claim with no repeat" do
      ran = []
      in_rolled_back_savepoint { deliver_once { ran << :rolled_back } }
      expect(ran).to eq([:rolled_back])
      expect(bookkeeping).to be_nil
      deliver_once { ran << :committed }
      expect(ran).to eq(%i[rolled_back committed])
      expect(bookkeeping).to eq("status" => "completed", "attempts" => 1, "duplicates" => 0, "repeats" => 0,
                                "facts" => 0)
    end

    it "counts no duplicate for a delivery of a completed operation" do
      deliver_once { :ran }
      in_rolled_back_savepoint { deliver_once { raise "ran twice" } }
      expect(bookkeeping).to eq("status" => "completed", "attempts" => 1, "duplicates" => 0, "repeats" => 0,
                                "facts" => 0)
    end

    it "leaves no record for a body that raised, its savepoint rolled back and the error rescued outside" do
      ActiveRecord::Base.transaction do
        ActiveRecord::Base.transaction(requires_new: true) { deliver_once { raise ArgumentError, "body failed" } }
      rescue ArgumentError
        nil # the outer transaction goes on and commits
      end
      expect(bookkeeping).to be_nil
      deliver_once { :ran }
      expect(bookkeeping).to eq("status" => "completed", "attempts" => 1, "duplicates" => 0, "repeats" => 0,
                                "facts" => 0)
    end

    # ActiveRecord::Rollback in a transaction block that joined an outer one rolls back
    # nothing: before, the joined session's block swallowed it, so the claim (and the
    # body's writes) stayed in the outer transaction and committed with it when the caller
    # rescued the gem's error, a claim left "claimed" while that error said "nothing was
    # recorded" (a later delivery would take it over and run the body again). The joined
    # session opens no block of its own now: the Rollback reaches the caller's block.
    it "lets a body's ActiveRecord::Rollback in a joined transaction roll back the caller's block" do
      after_delivery = []
      ActiveRecord::Base.transaction do
        deliver_once { raise ActiveRecord::Rollback }
        after_delivery << :ran
      rescue IdempotentJob::Error
        nil # the outer transaction goes on and commits
      end
      expect(after_delivery).to eq([])
      expect(bookkeeping).to be_nil
      ran = []
      deliver_once { ran << :first_claim }
      expect(ran).to eq([:first_claim])
      expect(bookkeeping).to eq("status" => "completed", "attempts" => 1, "duplicates" => 0, "repeats" => 0,
                                "facts" => 0)
    end

    # A body that raised in a joined transaction whose caller rescues the error and
    # commits: nothing rolls the claim back, so it is released in that transaction (as a
    # raising body's claim is outside one), not left "claimed" until its lease ends (a
    # later delivery deferred meanwhile, then taking it over as a stale claim). Before, the
    # joined session wrote no release (a transaction rolls back when the body raises).
    it "releases the claim of a body that raised in a joined transaction the caller commits" do
      ActiveRecord::Base.transaction do
        deliver_once { raise ArgumentError, "card declined" }
      rescue ArgumentError
        nil # the caller goes on and commits
      end
      expect(bookkeeping).to include("status" => "released", "attempts" => 1)
      expect(IdempotentJob.record(job_type, key).last_error).to eq("ArgumentError: card declined")
      ran = []
      outcome = deliver_once { ran << :again }
      expect([outcome.decision, ran]).to eq([:ran, [:again]])
      expect(bookkeeping).to include("status" => "completed", "attempts" => 2)
    end

    # PostgreSQL rolls an aborted transaction back at its end: no release is tried in
    # it (one would fail, logged as a claim left claimed until its lease ends).
    it "writes nothing for a body whose SQL error aborted the joined transaction" do
      log = StringIO.new
      SpecServices.configure_gem!(logger: Logger.new(log))
      ActiveRecord::Base.transaction do
        deliver_once { ActiveRecord::Base.connection.execute("SELECT 1/0") }
      rescue ActiveRecord::StatementInvalid
        nil
      end
      expect(bookkeeping).to be_nil
      expect(log.string).not_to include("could not release")
    end

    it "control: in a savepoint that is released, the duplicate is counted with the outer commit" do
      deliver_once { :ran }
      ActiveRecord::Base.transaction do
        ActiveRecord::Base.transaction(requires_new: true) { deliver_once { raise "ran twice" } }
      end
      expect(bookkeeping).to include("duplicates" => 1, "repeats" => 1)
    end
  end
end
