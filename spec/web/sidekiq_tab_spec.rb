# frozen_string_literal: true

require "spec_helper"
require "rack/test"
require "rack/session/cookie"
require "sidekiq/web"
require "idempotent_job/web"
require_relative "../support/web_records"

# The pages as a tab of the real Sidekiq Web (the installed Sidekiq: 6.4 and 8.1 in CI), with its
# own CSRF protection and layout, through Rack::Test.
RSpec.describe IdempotentJob::Web::SidekiqTab do
  include Rack::Test::Methods

  let(:job_type) { web_job_type }

  # Another spec file may have loaded idempotent_job/web before sidekiq/web.
  before(:all) { described_class.register }

  def app
    @app ||= Rack::Builder.new do
      use Rack::Session::Cookie, secret: "s" * 64, key: "spec.sidekiq"
      map("/sidekiq") { run Sidekiq::Web }
    end
  end

  it "registers itself when loaded after Sidekiq Web, once, as an Idempotency tab" do
    lib = File.expand_path("../../lib", __dir__)
    out = IO.popen([RbConfig.ruby, "-I", lib, "-e", <<~RUBY], err: %i[child out], &:read)
      require "sidekiq/web"
      require "idempotent_job/web"
      # Sidekiq 8 lists its own tabs there too: ours, once, and no second registration.
      p [Sidekiq::Web.tabs.select { |_, path| path == "idempotency" }, IdempotentJob::Web::SidekiqTab.register]
    RUBY
    expect(out).to eq(%([{"Idempotency"=>"idempotency"}, false]\n))
    expect(described_class.register).to be(false)
    expect(Sidekiq::Web.tabs).to include("Idempotency" => "idempotency")
    get "/sidekiq/"
    expect(last_response.body).to include(%(href="/sidekiq/idempotency"))
  end

  it "answers /metrics in Prometheus' text format, not inside Sidekiq's layout" do
    web_stopped(job_type, "7")
    get "/sidekiq/idempotency/metrics"
    expect(last_response.status).to eq(200)
    expect(last_response.content_type).to eq("text/plain; version=0.0.4; charset=utf-8")
    expect(last_response.body).to include(%(idempotent_job_records{job_type="#{job_type}",status="held"} 1\n))
    expect(last_response.body).not_to include("<html")
  end

  it "shows held operations inside Sidekiq's layout and resolves one with Sidekiq's CSRF token" do
    web_stopped(job_type, "7")
    get "/sidekiq/idempotency", job_type: job_type
    expect(last_response.status).to eq(200)
    expect(last_response.body).to include("Sidekiq", "Held <span class=\"ij-count\">(1)", ">7</a>")
    expect(last_response.body).to include(%(href="/sidekiq/idempotency/confirm?job_type=#{job_type}))

    get "/sidekiq/idempotency/confirm", job_type:, operation_key: "7", as: "done"
    expect(last_response.body).to include(%(action="/sidekiq/idempotency/resolve"))
    # Sidekiq Web's own protection: before 8.0 the session's token in the form; from 8.0 (its
    # `safe_request?`) a form carries none and a POST must come from the same origin, as a
    # browser says in Sec-Fetch-Site.
    same_origin = Sidekiq::Web.method_defined?(:safe_request?)
    token = last_response.body[/name='authenticity_token' value='([^']+)'/, 1]
    same_origin ? expect(token).to(be_nil) : expect(token).not_to(be_nil)

    post "/sidekiq/idempotency/resolve", { job_type:, operation_key: "7", as: "done" },
         "HTTP_SEC_FETCH_SITE" => "cross-site"
    expect(last_response.status).to eq(403)
    expect(IdempotentJob.record(job_type, "7").status).to eq(:held)

    proof = same_origin ? [{}, { "HTTP_SEC_FETCH_SITE" => "same-origin" }] : [{ authenticity_token: token }, {}]
    post "/sidekiq/idempotency/resolve", { job_type:, operation_key: "7", as: "done" }.merge(proof[0]), proof[1]
    expect(last_response.status).to eq(302)
    expect(last_response.location)
      .to end_with("/sidekiq/idempotency/record?job_type=#{job_type}&operation_key=7&resolved=done")
    expect(IdempotentJob.record(job_type, "7").status).to eq(:completed)
    follow_redirect!
    expect(last_response.body).to include("Resolved as done")
  end

  it "serves every page of the standalone app under the tab, with its status codes" do
    web_repeated(job_type, "1")
    { "/records?job_type=#{job_type}" => 200, "/repeats" => 200, "/takeovers" => 200,
      "/record?job_type=#{job_type}&operation_key=1" => 200, "/record?job_type=#{job_type}&operation_key=2" => 404,
      "/repeats?hours=x" => 400, "/repeats.csv" => 200 }.each do |sub, status|
      url = "/sidekiq/idempotency#{sub}"
      get url
      expect([url, last_response.status]).to eq([url, status])
      expect(last_response.body).to include(sub.include?(".csv") ? "job_type,operation_key" : "ij-nav")
    end
  end
end
