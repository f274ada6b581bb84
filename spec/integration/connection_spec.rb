# frozen_string_literal: true

require "spec_helper"
require "English"
require "fileutils"
require "socket"

# The connection layer under stress and failure, against real PostgreSQL servers on
# loopback (one of them stopped and restarted by the test).
RSpec.describe "The connection layer", :integration do
  let(:root) { File.expand_path("../..", __dir__) }

  it "lets 20 threads make their first call at once without a deadlock" do
    SpecServices.configure_gem!(pool_size: 20)
    gate = Queue.new
    threads = Array.new(20) do |i|
      Thread.new do
        gate.pop
        deliver_once("First", "#{unique_key}-#{i}").decision
      end
    end
    20.times { gate << true }
    results = Timeout.timeout(20) { threads.map(&:value) }
    expect(results).to all(eq(:ran))
  end

  it "raises a retryable TimeoutError when the pool is exhausted past checkout_timeout, never hangs" do
    SpecServices.configure_gem!(pool_size: 2, checkout_timeout: 0.5)
    key = unique_key
    stale_claim("Pool", key)
    errors = Queue.new
    with_row_locked("Pool", key) do
      threads = Array.new(5) do
        Thread.new do
          deliver_once("Pool", key)
        rescue IdempotentJob::Error => e
          errors << e
        end
      end
      sleep 1.5
      expect(errors.size).to eq(3) # two hold the pool's connections, blocked on the row lock
      threads.each { |t| t.kill.join } # interrupt the two blocked claims
    end
    timeouts = Array.new(errors.size) { errors.pop }
    expect(timeouts).to all(be_a(IdempotentJob::TimeoutError).and(be_retryable))
    expect(timeouts.first.message).to include("checkout_timeout")
  end

  it "raises a TimeoutError when a server accepts but never answers within connect_timeout" do
    silent = TCPServer.new("127.0.0.1", 0)
    accepted = Thread.new { Array.new(3) { silent.accept } }
    SpecServices.configure_gem!(database_url: "postgres://postgres@127.0.0.1:#{silent.addr[1]}/x", connect_timeout: 0.5)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect { deliver_once("Silent", "1") }.to raise_error(IdempotentJob::TimeoutError, /connect_timeout/)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 3
  ensure
    accepted&.kill
    silent&.close
  end

  it "raises a TimeoutError for a statement past statement_timeout" do
    SpecServices.configure_gem!(statement_timeout: 0.3)
    key = unique_key
    stale_claim("Slow", key)
    with_row_locked("Slow", key) do
      expect { deliver_once("Slow", key) }.to raise_error(IdempotentJob::TimeoutError) do |e|
        expect(e.sqlstate).to eq("57014")
      end
    end
  end

  it "connects from discrete fields alone, and keeps the record table in a configured schema" do
    uri = URI.parse(SpecServices.database_url)
    admin = PG.connect(SpecServices.database_url)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP SCHEMA IF EXISTS ij_custom CASCADE")
    admin.exec("CREATE SCHEMA ij_custom")
    IdempotentJob.reset!
    IdempotentJob.configure(host: uri.host, port: uri.port, dbname: uri.path.delete_prefix("/"), user: uri.user,
                            password: "unused-by-trust-auth", schema: "ij_custom", logger: Logger.new(File::NULL))
    expect(IdempotentJob.configuration.inspect).to include("password=[REDACTED]")
    expect(IdempotentJob.configuration.inspect).not_to include("unused-by-trust")
    expect(IdempotentJob.migrate!).to include("V1__create_idempotent_job_records")
    expect(deliver_once("Schema", "1").decision).to eq(:ran)
    expect(admin.exec("SELECT count(*) FROM ij_custom.idempotent_job_records").getvalue(0, 0)).to eq("1")
  ensure
    admin&.exec("DROP SCHEMA IF EXISTS ij_custom CASCADE")
    admin&.close
  end

  it "rejects unknown settings and bad values, naming them" do
    expect { IdempotentJob.configure(pool_sise: 3) }
      .to raise_error(IdempotentJob::ConfigurationError, /unknown idempotent_job setting :pool_sise/)
    expect { IdempotentJob.configure(schema: "x; DROP TABLE y") }
      .to raise_error(IdempotentJob::ConfigurationError, /schema must be a plain PostgreSQL identifier/)
    expect { IdempotentJob.configure(statement_timeout: 0) }
      .to raise_error(IdempotentJob::ConfigurationError, /statement_timeout/)
  end

  describe "an outage" do
    let(:dir) { File.join(root, "tmp", "outage-services") }
    let(:env) { { "PG_PORT" => "25346", "REDIS_PORT" => "63816" } }

    def services(command)
      out = IO.popen(env, [File.join(root, "bin/services"), command, dir], &:read)
      raise "bin/services #{command} failed" unless $CHILD_STATUS.success?

      out[/DATABASE_URL=(\S+)/, 1]
    end

    before do
      services("stop")
      FileUtils.rm_rf(dir) # a fresh server: no records from an earlier run
    end

    after { services("stop") }

    it "fails a delivery closed while PostgreSQL is down, and recovers when it is back" do
      url = services("start")
      log = StringIO.new
      SpecServices.configure_gem!(database_url: url.sub("//postgres@", "//postgres:pa55-secret@"),
                                  connect_timeout: 2, deadline: 2, logger: Logger.new(log))
      IdempotentJob.migrate!
      ChargeOrderJob.perform_async(1, 100)
      ChargeOrderJob.drain
      expect(IdempotentJob.record("ChargeOrderJob", "1")).to have_attributes(status: :completed)

      services("stop")
      ChargeOrderJob.perform_async(2, 100)
      expect { ChargeOrderJob.drain }.to raise_error(IdempotentJob::ConnectionError) do |e|
        expect(e).to be_retryable
        expect(e.message).not_to include("pa55-secret")
      end
      expect(Effects.count(2)).to eq(0) # fail closed: the body did not run

      services("start")
      ChargeOrderJob.perform_async(2, 100)
      ChargeOrderJob.drain
      expect(Effects.count(2)).to eq(1)
      expect(IdempotentJob.record("ChargeOrderJob", "2")).to have_attributes(status: :completed)
      expect(log.string).not_to include("pa55-secret")
    end

    it "records the completion of a body that ran just before PostgreSQL restarted" do
      SpecServices.configure_gem!(database_url: services("start"), connect_timeout: 2)
      IdempotentJob.migrate!
      restarted = nil
      outcome = IdempotentJob.perform_once("RestartedCompletion", "op-1", lease: 60) do
        services("stop") # the effect is done; now the server goes away for a while
        restarted = Thread.new do
          sleep 2.5
          services("start")
        end
        :charged
      end
      restarted.join
      expect(outcome).to have_attributes(ran?: true, value: :charged)
      expect(IdempotentJob.record("RestartedCompletion", "op-1")).to have_attributes(status: :completed)
    end
  end
end
