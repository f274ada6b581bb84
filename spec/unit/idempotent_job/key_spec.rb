# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Key do
  let(:job_class) do
    Class.new do
      def self.name = "ExampleJob"

      def perform(order_id, payload, *rest, flag: false); end
    end
  end

  def key(declaration, args)
    described_class.new(job_class, declaration).operation_key(args)
  end

  def key_error(declaration, args = [1, {}])
    expect { key(declaration, args) }.to raise_error(IdempotentJob::OperationKeyError) do |e|
      expect(e.message).to start_with("ExampleJob: idempotency key #{declaration.inspect}")
      expect(e.job_class).to eq("ExampleJob")
      yield e.message if block_given?
    end
  end

  describe "declarations" do
    it "names a perform parameter, as a Symbol or a String" do
      expect(key(:order_id, [42, {}])).to eq("42")
      expect(key("order_id", ["A-1", {}])).to eq("A-1")
    end

    it "takes an argument index" do
      expect(key(0, [42, {}])).to eq("42")
      expect(key(1, [42, "x"])).to eq("x")
    end

    it "follows a dotted path into a Hash argument, starting from a name or an index" do
      args = [1, { "order" => { "id" => 77, "lines" => [{ "sku" => "S" }] } }]
      expect(key("payload.order.id", args)).to eq("77")
      expect(key("1.order.id", args)).to eq("77")
      expect(key("payload.order.lines.0.sku", args)).to eq("S")
    end

    it "reads Symbol-keyed Hashes the same as String-keyed ones" do
      expect(key("payload.id", [1, { id: 5 }])).to eq(key("payload.id", [1, { "id" => 5 }]))
    end

    # A value key writes an Integer Hash key as its decimal text ({1 => "x"} is
    # {"1":"x"}, docs/canonical-json.md), so a path segment reaches it by that text too
    # (a String key of that text first, then its Symbol, then the Integer).
    it "reaches an Integer Hash key by the text a value key writes it as" do
      expect(key(:payload, [1, { 1 => "x" }])).to eq('{"1":"x"}')
      expect(key("payload.1", [1, { 1 => "x" }])).to eq("x")
      expect(key("1.1", [1, { 1 => "x" }])).to eq("x")
      expect(key("0.1", [{ 1 => "x" }, {}])).to eq("x")
      expect(key("payload.0.-2.id", [1, { 0 => { -2 => { id: 9 } } }])).to eq("9")
      expect(key("payload.#{2**70}", [1, { 2**70 => "big" }])).to eq("big")
      expect(key("payload.1", [1, { 1 => "int", "1" => "text" }])).to eq("text")
      key_error("payload.01", [1, { 1 => "x" }]) { |m| expect(m).to include('the Hash has no key "01"') }
      key_error("payload.1", [1, { 1.0 => "x" }]) { |m| expect(m).to include('the Hash has no key "1"') }
    end

    it "builds a composite key from an Array of parts" do
      expect(key([:order_id, "payload.line"], [42, { "line" => 3 }])).to eq('["42","3"]')
    end
  end

  describe "canonical operation keys" do
    it "stores a scalar in its string form: 42 and \"42\" are one operation" do
      expect(key(:order_id, [42, {}])).to eq(key(:order_id, ["42", {}]))
    end

    it "ignores Hash key order and Symbol/String keys" do
      a = key(:payload, [1, { "b" => 1, "a" => { "y" => 2, "x" => 1 } }])
      b = key(:payload, [1, { a: { x: 1, y: 2 }, b: 1 }])
      expect(a).to eq(b)
      expect(a).to eq('{"a":{"x":1,"y":2},"b":1}')
    end

    it "keeps composite parts apart: [\"a:b\",\"c\"] is not [\"a\",\"b:c\"]" do
      expect(key([0, 1], ["a:b", "c"])).not_to eq(key([0, 1], ["a", "b:c"]))
      expect(key([0, 1], ["a,b", "c"])).not_to eq(key([0, 1], ["a", "b,c"]))
    end

    it "never lets a JSON-looking String equal a Hash or Array argument" do
      expect(key(:payload, [1, '{"id":7}'])).not_to eq(key(:payload, [1, { "id" => 7 }]))
      expect(key(:payload, [1, "[1,2]"])).not_to eq(key(:payload, [1, [1, 2]]))
      expect(key(:payload, [1, '"[1]"'])).not_to eq(key(:payload, [1, "[1]"]))
      expect(key(:order_id, ["A-1", {}])).to eq("A-1")
    end

    it "treats integral Floats inside a Hash as Integers" do
      expect(key(:payload, [1, { "a" => 1.0 }])).to eq(key(:payload, [1, { "a" => 1 }]))
      expect(key(:payload, [1, { "a" => 1.5 }])).to eq('{"a":1.5}')
    end

    it "keeps Array order" do
      expect(key(:payload, [1, [1, 2]])).not_to eq(key(:payload, [1, [2, 1]]))
    end
  end

  describe "values the core's key rules do not carry (handled in Key, byte-identical to before)" do
    it "writes a Bignum in decimal, alone, in a composite and inside a Hash" do
      expect(key(0, [2**70, {}])).to eq("1180591620717411303424")
      expect(key([0, 1], [2**70, "x"])).to eq('["1180591620717411303424","x"]')
      expect(key(1, [1, { "n" => 2**70, "a" => 1 }])).to eq('{"a":1,"n":1180591620717411303424}')
    end

    it "writes non-String Hash keys as Strings, and takes a binary String holding UTF-8 by its bytes" do
      expect(key(1, [1, { 2 => "b", "a" => 1 }])).to eq('{"2":"b","a":1}')
      expect(key(0, ["caf\xC3\xA9".b, {}])).to eq("café")
      expect(key(0, ["[caf\xC3\xA9".b, {}])).to eq('"[café"')
    end

    it "refuses with the core's words, naming the part of a composite key" do
      key_error([0, 1], [1, 2.0]) do |m|
        expect(m).to include("(argument 1): a Float cannot be an operation key (floats are ambiguous as keys: " \
                             "pass an Integer or a String); use a String, an Integer, or a Hash/Array of JSON values")
      end
      key_error([0, 1], [2**70, ""]) { |m| expect(m).to include("(argument 1): the value is an empty String") }
      key_error([0, 1], [1, "\xFF".b]) do |m|
        expect(m).to include("(argument 1): the operation key is not valid UTF-8")
      end
      key_error(1, [1, { "t" => Time.at(0) }]) { |m| expect(m).to include("a Time cannot be an operation key") }
    end
  end

  describe "bad declarations" do
    it("rejects an unknown parameter name, listing the real ones") do
      key_error(:orderid) { |m| expect(m).to include("does not have", ":order_id") }
    end

    it("rejects a splat or keyword parameter") do
      key_error(:rest) { |m| expect(m).to include("not a plain positional parameter") }
      key_error(:flag) { |m| expect(m).to include("not a plain positional parameter") }
    end

    it "points a keyword parameter after plain positional ones to its path (ActiveJob's `\"1.order_id\"`)" do
      keywords = Class.new do
        def self.name = "KeywordJob"

        def perform(shop, order_id:, note: nil); end
      end
      expect { described_class.new(keywords, :order_id) }.to raise_error(IdempotentJob::OperationKeyError) do |e|
        expect(e.message).to start_with("KeywordJob: idempotency key :order_id names keyword parameter " \
                                        "\"order_id\" of KeywordJob#perform")
        expect(e.message).to include('declare the path "1.order_id"')
        expect(e.message).not_to include("use an argument index instead")
      end
      expect(described_class.new(keywords, "1.order_id").operation_key(["s", { "order_id" => 7 }])).to eq("7")
    end

    it("rejects a negative index") { key_error(-1) { |m| expect(m).to include("negative") } }
    it("rejects an empty composite") { key_error([]) { |m| expect(m).to include("empty Array") } }
    it("rejects empty path segments") { key_error("payload..id") { |m| expect(m).to include("empty") } }
    it("rejects other types") { key_error(1.5) { |m| expect(m).to include("Float") } }
    it("rejects nested Arrays") { key_error([[0]]) { |m| expect(m).to include("Array") } }
  end

  describe "bad values" do
    it("reports a missing argument") { key_error(1, [42]) { |m| expect(m).to include("argument 1 is missing") } }
    it("reports a nil value") { key_error(:order_id, [nil, {}]) { |m| expect(m).to include("nil") } }
    it("reports an empty String") { key_error(:order_id, ["", {}]) { |m| expect(m).to include("empty String") } }

    it "reports a missing Hash key" do
      key_error("payload.order.id", [1, { "order" => {} }]) { |m| expect(m).to include('no key "id"') }
    end

    it "reports a path through a scalar" do
      key_error("payload.id", [1, 5]) { |m| expect(m).to include("reaches into an Integer, not a Hash") }
      key_error("payload.id", [1, "text"]) { |m| expect(m).to include("reaches into a String, not a Hash") }
    end

    it "rejects a Float or boolean as the key, and non-JSON objects anywhere" do
      key_error(:order_id, [1.0, {}]) { |m| expect(m).to include("floats are ambiguous") }
      key_error(:order_id, [true, {}]) { |m| expect(m).to include("TrueClass") }
      key_error(:payload, [1, { "at" => Object.new }]) { |m| expect(m).to include("an Object cannot be") }
      key_error(:payload, [1, { "at" => Time.at(0) }]) { |m| expect(m).to include("a Time cannot be") }
    end

    it "says that the job was not run and nothing was recorded" do
      key_error(:order_id, [nil, {}]) { |m| expect(m).to include("not run and nothing was recorded") }
    end
  end

  describe "in the Sidekiq chains" do
    it "refuses at enqueue time a job whose arguments yield no key" do
      expect { ChargeOrderJob.perform_async(nil, 100) }
        .to raise_error(IdempotentJob::OperationKeyError, /ChargeOrderJob: idempotency key ("order_id"|:order_id)/)
      expect(ChargeOrderJob.jobs).to be_empty
    end

    it "refuses in the worker, before the body, a delivery that yields no key" do
      job = { "class" => "ChargeOrderJob", "args" => [nil, 1], "jid" => "j1", "queue" => "default",
              "idempotency_key" => "order_id" }
      expect { ChargeOrderJob.process_job(job) }.to raise_error(IdempotentJob::OperationKeyError)
      expect(Effects.count).to eq(0)
    end

    it "rejects a bad lease naming the job" do
      expect { ChargeOrderJob.set(idempotency_lease: 0).perform_async(1, 1) }
        .to raise_error(IdempotentJob::ConfigurationError, /ChargeOrderJob: idempotency_lease must be a positive/)
    end
  end
end
