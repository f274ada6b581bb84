# frozen_string_literal: true

require "spec_helper"
require "open3"

# examples/testing uses the kit exactly as the README shows: through Bundler, with the
# gem as a path gem, its own jobs and models, and its own spec_helper.
RSpec.describe "The examples/testing sample app" do
  let(:app) { File.join(SpecServices::ROOT, "examples", "testing") }

  # A lockfile per Ruby ABI in tmp/: the host's Ruby and the testing root's (one checkout)
  # resolve the app to other gem versions. BUNDLE_LOCKFILE is read by Bundler 2.6 and later
  # (the root's 4.0); Debian 12's 2.3 ignores it and keeps examples/testing/Gemfile.lock.
  def run_app(env, *command)
    lockfile = File.join(SpecServices::ROOT, "tmp", "examples-testing-#{RUBY_VERSION[/\A\d+\.\d+/]}.Gemfile.lock")
    Open3.capture2e({ "BUNDLE_LOCKFILE" => lockfile }.merge(env), *command, chdir: app)
  end

  before do
    out, status = run_app({}, "bundle", "install", "--local", "--quiet")
    expect(status).to be_success, out
  end

  it "passes on a throwaway PostgreSQL when no DATABASE_URL is set" do
    out, status = run_app({ "DATABASE_URL" => nil }, "bundle", "exec", "rspec")
    expect(status).to be_success, out
    expect(out).to include("4 examples, 0 failures")
  end

  it "fails every example with the gem disabled, naming each delivery pattern that repeated the effect" do
    out, status = run_app({ "IDEMPOTENT_JOB_TESTING_DISABLED" => "1" }, "bundle", "exec", "rspec")
    expect(status).not_to be_success
    expect(out).to include("4 examples, 4 failures")
    expect(out).to include("the same arguments delivered 3 times in a row: FAILED")
    expect(out).to include("3 workers (processes) delivering the same arguments at once: FAILED")
    expect(out).to include("a redelivery while the killed worker's lease was still live ran the body again")
  end
end
