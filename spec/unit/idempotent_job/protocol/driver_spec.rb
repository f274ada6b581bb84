# frozen_string_literal: true

require "spec_helper"

# The native protocol of a job's options is built once (a native call) and found again by
# the options object. The door words it tells notes and errors in come with each delivery
# and are kept by the core (`Told` in crates/core/src/protocol/mod.rs, whose test shows
# that a door whose words alternate, such as an ActiveJob class waiting in place under one
# adapter and re-enqueueing under another, rebuilds none).
RSpec.describe IdempotentJob::Protocol::Driver do
  it "keeps one native protocol per job options, so no delivery rebuilds it" do
    options = IdempotentJob::JobOptions.new("DriverCacheJob", {})
    native = described_class.native(options)
    expect(described_class.native(options)).to equal(native)
    expect(described_class.native(IdempotentJob::JobOptions.new("DriverCacheJob", {}))).not_to equal(native)
  end
end
