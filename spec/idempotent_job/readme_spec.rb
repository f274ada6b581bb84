# frozen_string_literal: true

require "spec_helper"

RSpec.describe "README.md and docs/" do
  let(:pages) do
    root = File.expand_path("../..", __dir__)
    ["README.md", *Dir.glob("docs/*.md", base: root)].to_h { |page| [page, File.read(File.join(root, page))] }
  end

  it "shows the claim statement exactly as the native core sends it" do
    expect(pages.values).to include(a_string_including("```sql\n#{IdempotentJob.claim_sql}\n```"))
  end
end
