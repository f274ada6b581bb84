# frozen_string_literal: true

require "spec_helper"

# The native protocol of a job's options is built once per set of its door's words: a
# door class whose words change from one delivery to the next (an ActiveJob class that
# waits in place under an inline adapter and re-enqueues under another: two defer_texts)
# finds each set's protocol again instead of rebuilding it (a native call, per delivery).
RSpec.describe IdempotentJob::Protocol::Driver do
  let(:door_class) do
    Class.new(IdempotentJob::Door) do
      def initialize(in_place)
        super()
        @in_place = in_place
      end

      def defer_text
        @in_place ? "waiting in place for" : "re-enqueued after"
      end
    end
  end

  it "keeps a native protocol per set of a door's words, so alternating words rebuild none" do
    options = IdempotentJob::JobOptions.new("DriverCacheJob", {})
    waiting = described_class.native(options, door_class.new(true))
    requeued = described_class.native(options, door_class.new(false))
    expect(requeued).not_to equal(waiting)
    expect(described_class.native(options, door_class.new(true))).to equal(waiting)
    expect(described_class.native(options, door_class.new(false))).to equal(requeued)
  end
end
