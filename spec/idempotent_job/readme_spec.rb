# frozen_string_literal: true

require "spec_helper"

RSpec.describe "README.md" do
  let(:readme) { File.read(File.expand_path("../../README.md", __dir__)) }

  it "shows the claim statement exactly as the native core sends it" do
    expect(readme).to include("```sql\n#{IdempotentJob.claim_sql}\n```")
  end
end
