# frozen_string_literal: true

require "spec_helper"
require "json"

# lib/idempotent_job/errors.rb against the core's one error table: every class the core
# names exists under IdempotentJob, carries the table's attributes and says retryable?
# as the table does, both when Ruby code raises it and when the native layer builds it
# (which also says sends_back? as the table does); a class the table gives no attribute
# of another's does not define it.
RSpec.describe "IdempotentJob's error classes" do
  table = JSON.parse(IdempotentJob::Native.error_table_json)
  all_attributes = table.flat_map { |entry| entry["attributes"] }.uniq

  it "are the core's table, one class per entry" do
    names = table.map { |entry| entry["name"] }
    expect(names).to include("Error", "ConfigurationError", "LostClaimError", "LookupError")
    defined = IdempotentJob.constants.select { |c| IdempotentJob.const_get(c).is_a?(Class) }
                           .select { |c| IdempotentJob.const_get(c) <= IdempotentJob::Error }.map(&:to_s)
    expect(defined).to match_array(names)
  end

  table.each do |entry|
    name = entry["name"]

    it "#{name}: a subclass of the base with the table's attributes and retryable flag" do
      klass = IdempotentJob.const_get(name)
      expect(klass).to be <= IdempotentJob::Error
      entry["attributes"].each { |attribute| expect(klass.method_defined?(attribute)).to be(true), attribute }
      expect(klass.new("raised by Ruby").retryable?).to eq(entry["always_retryable"])

      built = IdempotentJob::Native.error_example(name)
      expect(built).to be_an_instance_of(klass)
      expect(built.retryable?).to be(true) if entry["always_retryable"]
      expect(built.sends_back?).to be(entry["sends_back"])
      (all_attributes - entry["attributes"]).each do |attribute|
        expect(klass.method_defined?(attribute)).to be(false)
      end
      core_set = entry["attributes"] - entry["host_attributes"] # the host's own are set where it raises
      core_set.each { |attribute| expect(built.public_send(attribute)).to be_a(String).and(satisfy(&:itself)) }
      entry["sqlstates"].reject { |s| s.include?("*") }.each do |sqlstate|
        expect(IdempotentJob::Native.server_error(sqlstate, "m")).to be_an_instance_of(klass)
      end
    end
  end

  it "OperationKeyError is raised with the table's host attributes filled in where the job is known" do
    entry = table.find { |e| e["name"] == "OperationKeyError" }
    expect(entry["host_attributes"]).to match_array(%w[job_type job_class declaration])
    refused = lambda do |&call|
      call.call
    rescue IdempotentJob::OperationKeyError => e
      e
    end
    checked = refused.call { IdempotentJob::Key.check!("charges", "a\0b", job_name: "ChargeJob", declaration: :id) }
    expect([checked.job_type, checked.job_class, checked.declaration]).to eq(["charges", "ChargeJob", :id])
    problem = IdempotentJob::Native.operation_key_problem("charges", "a\0b")
    expect(checked.message).to eq(IdempotentJob::Native.key_refusal("ChargeJob", problem))
    declared = refused.call { IdempotentJob::Key.new("ChargeJob", 0).operation_key([nil], job_type: "charges") }
    expect([declared.job_type, declared.job_class, declared.declaration]).to eq(["charges", "ChargeJob", 0])
    direct = refused.call { IdempotentJob::Key.value_key(nil, "PlainJob") }
    expect([direct.job_type, direct.job_class, direct.declaration]).to eq(["PlainJob", "PlainJob", nil])
    expect(direct.message).to eq(IdempotentJob::Native.key_refusal("PlainJob", "operation key: the value is nil"))
  end

  it "DatabaseError is retryable for the table's transient SQLSTATEs only" do
    entry = table.find { |e| e["name"] == "DatabaseError" }
    entry["retryable_sqlstates"].map { |s| s.sub("*", "100") }.each do |sqlstate|
      expect(IdempotentJob::Native.server_error(sqlstate, "m")).to be_retryable, sqlstate
    end
    expect(IdempotentJob::Native.server_error("23505", "m")).not_to be_retryable
  end
end
