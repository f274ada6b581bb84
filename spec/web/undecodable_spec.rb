# frozen_string_literal: true

require "spec_helper"
require "rack/test"
require "idempotent_job/web"

# A database created with ENCODING 'SQL_ASCII' accepts any bytes; PostgreSQL then refuses
# (22021) to send a row holding bytes that are not UTF-8 to a UTF-8 client. The page and
# /metrics answer a readable error page for such a row, never an exception out of Rack.
RSpec.describe IdempotentJob::Web, "on a SQL_ASCII database holding bytes that are not UTF-8" do
  include Rack::Test::Methods

  let(:name) { "idempotent_job_sql_ascii" }

  def app
    IdempotentJob::Web
  end

  before do
    admin = PG.connect(SpecServices.database_url)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP DATABASE IF EXISTS #{name} WITH (FORCE)")
    admin.exec("CREATE DATABASE #{name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    admin.close
    SpecServices.configure_gem!(database_url: SpecServices.database_url.sub(%r{/[^/?]+(\?|\z)}, "/#{name}\\1"))
    IdempotentJob.migrate!
  end

  after do
    IdempotentJob.reset!
    SpecServices.configure_gem!
  end

  # Writes a held record whose `column` holds the byte 0xFF, through a SQL_ASCII client.
  def seed(column)
    IdempotentJob.perform_once("AsciiJob", "k-#{column}") { nil }
    conn = PG.connect(IdempotentJob.configuration.database_url)
    conn.exec("SET client_encoding = 'SQL_ASCII'")
    value = "bad \xFF byte".b
    conn.exec_params("UPDATE idempotent_job_records SET #{column} = $1, status = 'held', " \
                     "held_at = now() WHERE operation_key = $2", [value, "k-#{column}"])
  ensure
    conn&.close
  end

  %w[job_type operation_key last_error].each do |column|
    it "answers a readable page, not an exception, for a #{column} that is not UTF-8" do
      seed(column)
      %w[/ /records?job_type=AsciiJob /metrics].each do |path|
        expect { get path }.not_to raise_error
        # /metrics reads job types only: a key or an error that is not UTF-8 does not reach it.
        if path == "/metrics" && column != "job_type"
          expect(last_response.status).to eq(200)
          next
        end
        expect(last_response.status).to eq(500), "#{path}: #{last_response.status}"
        expect(last_response.body).to include("bytes that are not UTF-8", "SQL_ASCII")
      end
    end
  end
end
