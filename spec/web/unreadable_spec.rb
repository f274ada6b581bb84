# frozen_string_literal: true

require "spec_helper"
require "rack/test"
require "cgi"
require "idempotent_job/web"
require_relative "../support/web_records"

# A record the database holds but the core cannot read (a time edited by hand to
# 'infinity', which no Ruby or Python time holds): the core refuses it with an
# UnreadableRecordError (a ConfigurationError) naming the record and the column. That is not the browser's bad
# input: the record's page answers a 500 saying which record cannot be read and why, never
# a 400 "bad request" (a bad parameter stays a 400); a list shows the other records and
# marks that one. Through Rack::Test against the real
# PostgreSQL.
RSpec.describe IdempotentJob::Web, "with a record the core cannot read" do
  include Rack::Test::Methods

  let(:job_type) { web_job_type("WebUnreadableJob") }

  def app
    IdempotentJob::Web
  end

  after do
    Effects.connection.exec_params("DELETE FROM idempotent_job_records WHERE job_type = $1", [job_type])
  end

  it "lists the other records and marks the unreadable one; its record page is a 500 naming it, never a 400" do
    web_stopped(job_type, "7", as: :hold)
    web_stopped(job_type, "8", as: :hold)
    Effects.connection.exec_params(
      "UPDATE idempotent_job_records SET claimed_at = 'infinity' WHERE job_type = $1 AND operation_key = '7'",
      [job_type]
    )
    expect { IdempotentJob.record(job_type, "7") }
      .to raise_error(IdempotentJob::UnreadableRecordError, /its column claimed_at/) { |e|
        expect(e).to be_a(IdempotentJob::ConfigurationError)
        expect(e).not_to be_retryable
      }
    # A list reads each record on its own: one it cannot read is a marked row (its job
    # type and key, and which column), not a 500 hiding the others.
    ["/?job_type=#{job_type}", "/records?job_type=#{job_type}", "/takeovers"].each do |path|
      get path
      expect(last_response.status).to eq(200), "#{path}: #{last_response.status} #{last_response.body[0, 300]}"
      body = CGI.unescapeHTML(last_response.body)
      expect(body).to include("jid-8", "unreadable: claimed_at")
      expect(body).to include("operation_key=7") # the marked row links to its record page
    end

    get "/record?job_type=#{job_type}&operation_key=7"
    expect(last_response.status).to eq(500)
    body = CGI.unescapeHTML(last_response.body)
    expect(body).to include("A record cannot be read",
                            "the record of #{job_type} operation \"7\" cannot be read: its column claimed_at")
    expect(body).not_to include("Bad request")

    get "/records", job_type:, status: "finished"
    expect(last_response.status).to eq(400)
    expect(last_response.body).to include("unknown record status")
  end

  # /metrics reads every record's held_at for the oldest held age: one edited to
  # '-infinity' (held since ever) or 'infinity' must not break the scrape (PostgreSQL
  # before 17 refuses to subtract an infinite time, 22008; 17 and later answer an infinite
  # interval), and the value written is one Prometheus' text format knows (+Inf, never inf).
  it "answers /metrics with a held_at edited to an infinite time: +Inf held since ever, 0 for a future one" do
    web_stopped(job_type, "7", as: :hold)
    { "-infinity" => "+Inf", "infinity" => "0" }.each do |edited, age|
      Effects.connection.exec_params(
        "UPDATE idempotent_job_records SET held_at = '#{edited}' WHERE job_type = $1", [job_type]
      )
      get "/metrics"
      expect(last_response.status).to eq(200), "#{edited}: #{last_response.status} #{last_response.body[0, 300]}"
      expect(last_response.body).to include(%(idempotent_job_oldest_held_age_seconds{job_type="#{job_type}"} #{age}\n))
    end
  end

  # A resolve of a record the core cannot read changes nothing: before, RESOLVE_SQL settled
  # it and only its answer could not be read, so the caller got this error while the
  # record was completed (done) or released with its rerun never re-sent (rerun).
  it "refuses to resolve a record it cannot read, leaving it held" do
    web_stopped(job_type, "7", as: :hold)
    Effects.connection.exec_params(
      "UPDATE idempotent_job_records SET held_at = '-infinity' WHERE job_type = $1", [job_type]
    )
    %i[rerun done].each do |as|
      expect { IdempotentJob.resolve(job_type, "7", as:) }
        .to raise_error(IdempotentJob::UnreadableRecordError, /its column held_at/)
    end
    Effects.connection.exec_params("UPDATE idempotent_job_records SET held_at = now() WHERE job_type = $1", [job_type])
    expect(IdempotentJob.record(job_type, "7")).to have_attributes(status: :held, resolution: nil)
  end
end
