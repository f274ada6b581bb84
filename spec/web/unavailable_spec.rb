# frozen_string_literal: true

require "spec_helper"
require "rack/test"
require "rack/session/cookie"
require "sidekiq/web"
require "idempotent_job/web"

# The page and `/metrics` when the database cannot be read — a role the server does not
# know (28000), a database without the table (42P01, migrations never ran) — standalone and
# as a Sidekiq Web tab, through Rack::Test against the real PostgreSQL: a 503 naming the
# problem, never an exception into the host app.
RSpec.describe "IdempotentJob::Web when the database cannot be read" do
  include Rack::Test::Methods

  base = ENV.fetch("DATABASE_URL")
  empty = "ij_web_empty_#{Process.pid}"
  faults = {
    "a role the server does not know" => [base.sub(%r{://[^@/]*@}, "://no_such_web_role@"), "28000",
                                          /role "no_such_web_role" does not exist.*check database_url/],
    "a database where the migrations never ran" => [base.sub(%r{/[^/?]+(\?|\z)}, "/#{empty}\\1"), "42P01",
                                                    /idempotent_job_records.*apply the migrations/]
  }

  before(:all) do
    IdempotentJob::Web::SidekiqTab.register
    Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{empty}"))
    Effects.connection.exec(%(CREATE DATABASE "#{empty}"))
  end

  after(:all) do
    IdempotentJob.reset!
    Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{empty}" WITH (FORCE)))
  end

  after { SpecServices.configure_gem! }

  def app
    @app ||= Rack::Builder.new do
      use Rack::Session::Cookie, secret: "s" * 64, key: "spec.unavailable"
      map("/idempotency") { run IdempotentJob::Web }
      map("/sidekiq") { run Sidekiq::Web }
    end
  end

  faults.each do |fault, (url, state, problem)|
    context "with #{fault} (#{state})" do
      before { SpecServices.configure_gem!(database_url: url, deadline: 5) }

      %w[/idempotency /sidekiq/idempotency].each do |mount|
        it "answers every page under #{mount} with a 503 page naming the problem" do
          ["", "/records?job_type=X", "/record?job_type=X&operation_key=1", "/repeats", "/takeovers",
           "/confirm?job_type=X&operation_key=1&as=done"].each do |page|
            get "#{mount}#{page}"
            expect(last_response.status).to eq(503), "#{page}: #{last_response.status} #{last_response.body[0, 300]}"
            body = CGI.unescapeHTML(last_response.body)
            expect(body).to include("Unavailable: the idempotency records cannot be read")
            expect(body).to include("SQLSTATE #{state}").and match(problem)
            expect(last_response.content_type).to start_with("text/html")
          end
        end

        it "answers #{mount}/metrics with a plain-text 503 naming the problem" do
          get "#{mount}/metrics"
          expect(last_response.status).to eq(503)
          expect(last_response.content_type).to eq("text/plain; charset=utf-8")
          expect(last_response.body).to start_with("idempotent_job /metrics: the idempotency records cannot be read " \
                                                   "(DatabaseError, SQLSTATE #{state}): ")
          expect(last_response.body).to match(problem)
          expect(last_response.body).not_to include("<html")
        end
      end
    end
  end
end
