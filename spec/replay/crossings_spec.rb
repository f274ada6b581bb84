# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/testing"
require_relative "../support/transactional_jobs"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"

# Issue 30: a Ruby delivery runs in one native call (`Native::Protocol#perform`), as the
# Python binding's do. Every door's first delivery crosses from Ruby into the extension
# at most 4 times and a duplicate at most 2 (the key's text, the request's digest, the
# one call…). A crossing is a call, on the delivering thread, of a method the extension
# defines (`IdempotentJob::Native` and its classes), counted by a TracePoint on C calls;
# calls Ruby makes back into the extension from inside a callback count too, except the
# body's own (user code: its writes through the job's transaction handle).
RSpec.describe "Ruby -> Rust crossings per delivery" do
  # The extension's classes and modules: methods defined on them are native.
  def native_owners
    native = IdempotentJob::Native
    classes = native.constants.map { |name| native.const_get(name) }.grep(Module)
    ([native] + classes).flat_map { |owner| [owner, owner.singleton_class] }
  end

  # [count, names] of native calls made by the block on this thread.
  def crossings(&)
    owners = native_owners
    thread = Thread.current
    names = []
    trace = TracePoint.new(:c_call) do |tp|
      next unless Thread.current == thread && owners.include?(tp.defined_class)

      # The body's own calls (its writes through the transaction handle) are user code.
      names << "#{tp.defined_class}##{tp.method_id}" unless IdempotentJob.current_claim
    end
    trace.enable(&)
    [names.size, names]
  end

  def expect_at_most(limit, id)
    push.call(id)
    count, names = crossings { deliver.call(id) }
    expect(count).to be <= limit, "#{count} crossings (at most #{limit}): #{names.join(", ")}"
  end

  shared_examples "one native call" do |first_limit: 4, duplicate_limit: 2|
    it "crosses at most #{first_limit} times for a first delivery and #{duplicate_limit} for a duplicate" do
      push.call("warm-up")
      deliver.call("warm-up") # the job's options, the native protocol and the store are built once
      expect_at_most(first_limit, "first")
      expect_at_most(duplicate_limit, "first")
    end
  end

  # What a producer does before the delivery (not counted: another process's work).
  let(:push) { ->(_id) {} }

  describe "the Sidekiq door" do
    let(:push) { ->(id) { ChargeOrderJob.perform_async(id, 1500) } }
    let(:deliver) { ->(_id) { ChargeOrderJob.drain } }

    include_examples "one native call"
  end

  describe "the ActiveJob door" do
    around { |example| with_adapter(:inline) { example.run } }
    let(:deliver) { ->(id) { AjChargeOrderJob.perform_now(id, 1500) } }

    include_examples "one native call"
  end

  describe "the plain Ruby door" do
    let(:deliver) do
      lambda do |id|
        IdempotentJob.perform_once("PlainCharge", id, lease: 30, payload: [id, 1500]) { Effects.record("plain", id) }
      end
    end

    include_examples "one native call"
  end

  describe "the gem's transaction (transaction: true)" do
    let(:push) { ->(id) { RecordPaymentJob.perform_async(id, 500) } }
    let(:deliver) { ->(_id) { RecordPaymentJob.drain } }

    include_examples "one native call"
  end

  # A first delivery and a duplicate cross 2 times each (the key, the one call): the
  # duplicate's repeat bookkeeping is queued by the one call itself while ActiveRecord's
  # transaction is still open (the bookkeeping's batches skip the record's row until it
  # commits: crates/core/src/sql/flush.rs, FLUSH_SQL), nothing is asked after the commit.
  describe "ActiveRecord's transaction (transaction: :active_record)" do
    let(:push) { ->(id) { RecordPaymentArJob.perform_async(id, 500) } }
    let(:deliver) { ->(_id) { RecordPaymentArJob.drain } }

    include_examples "one native call", first_limit: 2, duplicate_limit: 2
  end
end
