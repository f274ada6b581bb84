# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/web"

RSpec.describe IdempotentJob::Web::Chart do
  let(:from) { Time.utc(2026, 12, 1, 0, 0) }
  let(:to) { Time.utc(2026, 12, 1, 4, 0) }

  it "counts each series' times per interval, leaving out times outside the period" do
    chart = described_class.new(series: { "A" => [from, from + 60, to - 1, to + 1], "B" => [from + 3700] },
                                from:, to:, buckets: 4)
    expect(chart.counts).to eq([{ "A" => 2 }, { "B" => 1 }, {}, { "A" => 1 }])
  end

  it "draws stacked bars with a hover title per segment, a legend and escaped names" do
    svg = described_class.new(series: { "<Evil>" => [from, from], "B" => [from + 10] }, from:, to:, buckets: 4).to_svg
    expect(svg).to start_with("<svg class=\"ij-chart\"")
    expect(svg).to include("<title>&lt;Evil&gt;: 2 repeats, 00:00 – 01:00</title>",
                           "<title>B: 1 repeat, 00:00 – 01:00</title>")
    expect(svg).to include("&lt;Evil&gt; (2)", "B (1)", "3 repeats from 00:00 to 04:00, at most 3 in one interval")
    expect(svg.scan("<rect").size).to eq(2 + 2) # two segments, two legend keys
    expect(svg).not_to include("<Evil>")
  end

  it "refuses an empty period" do
    expect { described_class.new(series: {}, from: to, to: from) }.to raise_error(ArgumentError, /to > from/)
  end
end
