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
  broken = "ij_web_broken_#{Process.pid}"
  role = "ij_web_noselect_#{Process.pid}"
  faults = {
    "a role the server does not know" => [base.sub(%r{://[^@/]*@}, "://no_such_web_role@"), "28000",
                                          /role "no_such_web_role" does not exist.*check database_url/],
    "a database where the migrations never ran" => [base.sub(%r{/[^/?]+(\?|\z)}, "/#{empty}\\1"), "42P01",
                                                    /idempotent_job_records.*apply the migrations/],
    "a role without SELECT privilege on the table" => [base.sub(%r{://[^@/]*@}, "://#{role}@"), "42501",
                                                       /permission denied for table idempotent_job_records/]
  }

  before(:all) do
    IdempotentJob::Web::SidekiqTab.register
    Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{empty}"))
    Effects.connection.exec(%(CREATE DATABASE "#{empty}"))
    Effects.connection.exec(%(DROP ROLE IF EXISTS "#{role}"))
    Effects.connection.exec(%(CREATE ROLE "#{role}" LOGIN))
  end

  after(:all) do
    IdempotentJob.reset!
    Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{empty}" WITH (FORCE)))
    Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{broken}" WITH (FORCE)))
    Effects.connection.exec(%(DROP ROLE IF EXISTS "#{role}"))
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

  # The gem's own settings that build no store (no database_url anywhere) are the
  # server's problem, not the browser's: a 503 naming it (/metrics a plain-text one),
  # never a 400 "bad request" (before: both answered the HTML 400 page).
  context "with no database_url set anywhere (a ConfigurationError of the settings)" do
    def without_database_url
      saved = ENV.to_h.slice("DATABASE_URL", "IDEMPOTENT_JOB_DATABASE_URL")
      saved.each_key { |name| ENV.delete(name) }
      IdempotentJob.reset!
      yield
    ensure
      ENV.update(saved)
    end

    %w[/idempotency /sidekiq/idempotency].each do |mount|
      it "answers #{mount} with a 503 naming the setting, and #{mount}/metrics with a plain-text 503" do
        without_database_url do
          unconfigured_page(mount)
          unconfigured_metrics(mount)
        end
      end
    end

    def unconfigured_page(mount)
      get mount
      expect(last_response.status).to eq(503), "#{last_response.status} #{last_response.body[0, 300]}"
      expect(CGI.unescapeHTML(last_response.body))
        .to include("Unavailable: the idempotency records cannot be read (ConfigurationError): database_url is not set")
    end

    def unconfigured_metrics(mount)
      get "#{mount}/metrics"
      expect(last_response.status).to eq(503)
      expect(last_response.content_type).to eq("text/plain; charset=utf-8")
      expect(last_response.body).to start_with("idempotent_job /metrics: the idempotency records cannot be read " \
                                               "(ConfigurationError): database_url is not set")
    end
  end

  # Any other answer of the server (a syntax error, an internal error: a bug, not a
  # database that cannot be read) is raised to the host app, whose error tracker sees it.
  context "with an error of the server that is not a database that cannot be read (XX000)" do
    before do
      Effects.connection.exec(%(DROP DATABASE IF EXISTS "#{broken}" WITH (FORCE)))
      Effects.connection.exec(%(CREATE DATABASE "#{broken}"))
      url = base.sub(%r{/[^/?]+(\?|\z)}, "/#{broken}\\1")
      SpecServices.configure_gem!(database_url: url, deadline: 5)
      IdempotentJob.migrate!
      IdempotentJob.perform_once("BrokenJob", "1") { nil }
      conn = PG.connect(url)
      # The table behind a view whose function fails as a broken extension does.
      conn.exec(<<~SQL)
        ALTER TABLE idempotent_job_records RENAME TO ij_records_behind;
        CREATE FUNCTION ij_boom() RETURNS boolean STABLE LANGUAGE plpgsql AS
          $$BEGIN RAISE EXCEPTION 'ij_boom: internal failure' USING ERRCODE = 'XX000'; END$$;
        CREATE VIEW idempotent_job_records AS SELECT * FROM ij_records_behind WHERE ij_boom();
      SQL
      conn.close
    end

    it "raises it from the page and /metrics, not a 503" do
      ["/idempotency", "/idempotency/records?job_type=BrokenJob", "/idempotency/metrics"].each do |page|
        expect { get page }.to raise_error(IdempotentJob::DatabaseError, /ij_boom: internal failure/) { |e|
          expect(e.sqlstate).to eq("XX000")
        }
      end
    end
  end

  describe "which server answers are a database that cannot be read (503)" do
    it "takes connection, authentication, missing database/table/column, privilege, resources, " \
       "operator intervention and read-only answers; not the others" do
      unavailable = %w[08006 28000 28P01 3D000 42P01 42703 42501 53100 53300 57014 57P01 25006]
      raised = %w[42601 XX000 23505 22012 42883 40001 P0001 0A000]
      verdict = ->(state) { IdempotentJob::Web::Actions.unavailable?(IdempotentJob::Native.server_error(state, "m")) }
      unavailable.each { |state| expect(verdict.call(state)).to be(true), state }
      raised.each { |state| expect(verdict.call(state)).to be(false), state }
      expect(IdempotentJob::Web::Actions.unavailable?(IdempotentJob::Native.server_error(nil, "lost"))).to be(true)
    end
  end
end
