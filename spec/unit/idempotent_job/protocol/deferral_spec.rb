# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Protocol::Deferral do
  it "starts at 1 s and doubles with each deferral the delivery already had" do
    expect((0..4).map { |n| described_class.delay(300, n, margin: 1) }).to eq([1.0, 2.0, 4.0, 8.0, 16.0])
  end

  it "never comes back later than the holder's lease end plus the margin" do
    expect(described_class.delay(3.2, 5, margin: 1)).to be_within(0.001).of(4.2)
    expect(described_class.delay(0.1, 0, margin: 0)).to be_within(0.001).of(0.1)
    expect(described_class.delay(300, 10_000, margin: 1)).to eq(301.0)
  end

  it "uses the configured defer_margin by default" do
    IdempotentJob.configure(defer_margin: 2)
    expect(described_class.delay(0.5, 3)).to eq(2.5)
  end
end
