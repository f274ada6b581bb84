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
end
