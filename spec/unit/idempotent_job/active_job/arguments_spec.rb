# frozen_string_literal: true

require "spec_helper"
require_relative "../../../support/active_job_jobs"

# A GlobalID-able object that needs no database.
class ArgumentsSpecAccount
  include GlobalID::Identification
  attr_reader :id

  def initialize(id)
    @id = id
  end

  def self.find(id)
    new(id)
  end
end

# The operation key of an ActiveJob job comes from perform's deserialized arguments,
# a GlobalID-able argument by its GlobalID.
RSpec.describe IdempotentJob::ActiveJobDoor::Arguments do
  def key_of(declaration, arguments, job_class: AjShipOrderJob)
    IdempotentJob::Key.new(job_class, declaration).operation_key(described_class.keyable(arguments))
  end

  let(:account) { ArgumentsSpecAccount.new(7) }
  let(:gid) { "gid://idempotent-job-spec/ArgumentsSpecAccount/7" }

  it "keys a GlobalID-able argument by its GlobalID, by parameter name and by index" do
    expect(key_of(:order, [account, "dhl"])).to eq(gid)
    expect(key_of(0, [account, "dhl"])).to eq(gid)
  end

  it "keys the same record delivered as two different objects the same" do
    same = key_of(:order, [ArgumentsSpecAccount.find(7), "y"])
    expect(key_of(:order, [ArgumentsSpecAccount.new(7), "x"])).to eq(same)
    expect(key_of(:order, [ArgumentsSpecAccount.new(8), "x"])).not_to eq(key_of(:order, [account, "x"]))
  end

  it "replaces GlobalID-able objects inside Hashes and Arrays, for dotted paths and whole values" do
    arguments = [{ "order" => { "account" => account }, list: [account] }, "dhl"]
    expect(key_of("0.order.account", arguments)).to eq(gid)
    expect(key_of("0.list.0", arguments)).to eq(gid)
    expect(JSON.parse(key_of(0, arguments))).to eq("list" => [gid], "order" => { "account" => gid })
  end

  it "builds composite keys with the GlobalID as one part" do
    expect(JSON.parse(key_of(%i[order carrier], [account, "dhl"]))).to eq([gid, "dhl"])
  end

  it "leaves other values to IdempotentJob::Key, which refuses what cannot be a key, naming the job" do
    expect(key_of(1, [account, :dhl])).to eq("dhl")
    expect { key_of(:order, [Time.now, "dhl"]) }
      .to raise_error(IdempotentJob::OperationKeyError, /AjShipOrderJob: .*a Time cannot be an operation key/)
    expect { key_of(:order, [nil, "dhl"]) }.to raise_error(IdempotentJob::OperationKeyError, /the value is nil/)
  end

  it "does not change the arguments it is given" do
    arguments = [{ "account" => account }]
    described_class.keyable(arguments)
    expect(arguments.first["account"]).to be(account)
  end
end
