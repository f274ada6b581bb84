# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Configuration do
  subject(:config) { described_class.new }

  around do |example|
    saved = ENV.to_h.slice("IDEMPOTENT_JOB_DATABASE_URL", "DATABASE_URL")
    example.run
  ensure
    %w[IDEMPOTENT_JOB_DATABASE_URL DATABASE_URL].each { |k| ENV[k] = saved[k] }
  end

  it "takes seconds as a Rails app writes them (10.minutes), a Rational or a BigDecimal, as Floats" do
    require "active_support"
    require "active_support/core_ext/integer/time"
    require "bigdecimal"
    # Each was refused: 'lease must be a positive number of seconds ..., got 10 minutes'.
    config = described_class.new
    config.lease = 10.minutes
    config.connect_timeout = 1.5.seconds
    config.statement_timeout = Rational(1, 2)
    config.retention = 7.days
    config.deadline = BigDecimal("2.5")
    expect([config.lease, config.connect_timeout, config.statement_timeout, config.retention, config.deadline])
      .to eq([600.0, 1.5, 0.5, 604_800.0, 2.5])
    expect(JSON.parse(config.to_native_json)).to include("connect_timeout" => 1.5, "deadline" => 2.5)
    expect { config.lease = -1.minute }
      .to raise_error(IdempotentJob::ConfigurationError, /\Alease must be .*, got -1 minutes\z/)
    expect(IdempotentJob::Native.job_option("Job", "idempotency_", "lease", 5.minutes)).to eq(300.0)
  end

  it "reads IDEMPOTENT_JOB_DATABASE_URL, then DATABASE_URL, unless a URL is set" do
    ENV["IDEMPOTENT_JOB_DATABASE_URL"] = nil
    ENV["DATABASE_URL"] = "postgres://b/db"
    expect(config.database_url).to eq("postgres://b/db")
    ENV["IDEMPOTENT_JOB_DATABASE_URL"] = "postgres://a/db"
    expect(config.database_url).to eq("postgres://a/db")
    config.database_url = "postgres://c/db"
    expect(config.database_url).to eq("postgres://c/db")
  end

  it "reads the retention default from the core and names the nearest setting for a misspelled one" do
    expect(described_class.new.retention).to eq(IdempotentJob::Native::DEFAULT_RETENTION).and eq(2_592_000)
    expect { described_class.new.update(leese: 60) }
      .to raise_error(IdempotentJob::ConfigurationError,
                      /\Aunknown idempotent_job setting :leese \(did you mean lease\?\) \(known: pool_size, /)
    # In a configure block too (it was NoMethodError); other unknown methods stay Ruby's.
    expect { IdempotentJob.configure { |c| c.leese = 5 } }
      .to raise_error(IdempotentJob::ConfigurationError, /setting "leese" \(did you mean lease\?\)/)
    expect { described_class.new.leese }.to raise_error(NoMethodError)
  end

  it "defaults the lease to 300 seconds and rejects a non-positive lease or one shorter than 0.25 s" do
    expect(config.lease).to eq(300)
    expect { config.lease = 0 }.to raise_error(IdempotentJob::ConfigurationError, /lease must be a positive/)
    expect { IdempotentJob.configure(lease: 0.1) }
      .to raise_error(IdempotentJob::ConfigurationError, /lease must be at least 0.25 s.*got 0.1/)
    config.lease = 0.25
    expect(config.lease).to eq(0.25)
    expect { config.lease = "5" }.to raise_error(IdempotentJob::ConfigurationError)
  end

  it "never shows the password in inspect or to_s, whatever the URL's syntax" do
    config.database_url = "postgres://app:pa55-secret@db.internal:5432/app"
    expect(config.to_s).to include('database_url="postgres://app@db.internal:5432/app"')
    ["postgres://app:pa/55-secret@db:notaport/app", "host=db password = pa55-secret port=x",
     "host=db password='pa55-secret x' port=x", "postgres://app:pa55-secret@db:notaport/app"].each do |url|
      config.database_url = url
      expect(config.inspect).not_to include("55-secret")
      expect { IdempotentJob::Native::Store.new({ database_url: url, connect_timeout: 1 }.to_json) }
        .to raise_error(IdempotentJob::ConfigurationError) { |e| expect(e.message).not_to include("55-secret") }
    end
  end

  it "talks to plain PostgreSQL by default and takes compatibility: :distributed (docs/scaling.md)" do
    expect(config.compatibility).to eq(:postgresql)
    config.compatibility = :distributed
    expect(JSON.parse(config.to_native_json)).to include("compatibility" => "distributed")
    config.compatibility = "postgresql"
    expect(config.compatibility).to eq(:postgresql)
    expect { config.compatibility = :cockroach }
      .to raise_error(IdempotentJob::ConfigurationError,
                      /\Acompatibility must be one of postgresql, distributed, got :cockroach\z/)
    expect(config.compatibility).to eq(:postgresql)
  end

  it "prepares the gem's statements by default, and accepts only true or false for prepared_statements" do
    expect(config.prepared_statements).to be(true)
    expect(JSON.parse(config.to_native_json)).to include("prepared_statements" => true)
    config.prepared_statements = false
    expect(JSON.parse(config.to_native_json)).to include("prepared_statements" => false)
    expect(config.inspect).to include("prepared_statements=false")
    ["yes", nil, 1].each do |value|
      message = /prepared_statements must be true or false, got #{Regexp.escape(value.inspect)}/
      expect { IdempotentJob.configure(prepared_statements: value) }
        .to raise_error(IdempotentJob::ConfigurationError, message)
    end
    expect(IdempotentJob.configuration.prepared_statements).to be(true)
  end

  # Issue 30: the core's words (config::must_be_set, naming the table's default), Python's
  # for a None too (python/tests/test_same_words.py).
  it "refuses an unset job default naming the core's default" do
    { lease: "300", on_stale: '"reclaim"', heartbeat: "true" }.each do |name, default|
      message = /\A#{name} must be set \(its default is #{default}\), got nil\z/
      expect { config.public_send("#{name}=", nil) }.to raise_error(IdempotentJob::ConfigurationError, message)
    end
  end

  it "checks defer_margin and retention by the core's rule (0 to ten years), as Python does" do
    expect(config.defer_margin).to eq(IdempotentJob::Native::DEFAULT_DEFER_MARGIN).and eq(1)
    config.retention = 0 # a purge deletes every finished record (Ruby refused 0 before issue 30 item D)
    expect(config.retention).to eq(0)
    config.defer_margin = 0
    expect(config.defer_margin).to eq(0)
    [-1, nil, "5", Float::INFINITY, 315_360_001].each do |value|
      %w[retention defer_margin].each do |name|
        message = /\A#{name} must be a number of seconds from 0 to 315360000, got #{Regexp.escape(value.inspect)}\z/
        expect { config.public_send("#{name}=", value) }.to raise_error(IdempotentJob::ConfigurationError, message)
      end
    end
    expect(described_class::SETTINGS).to include(*IdempotentJob::Native.job_default_settings.map(&:to_sym))
  end

  # Issue 30: the core's rule and words for each connection setting (the same as Python's,
  # python/tests/test_plain.py), raised by the writer, where the value is assigned.
  it "checks each connection setting at assignment by the core's rule, in its words" do
    {
      connect_timeout: [315_360_001, "a positive number of seconds up to 315360000 (ten years)"],
      checkout_timeout: [0, "a positive number of seconds up to 315360000 (ten years)"],
      enqueue_check_timeout: [Float::INFINITY, "a positive number of seconds up to 315360000 (ten years)"],
      deadline: [3_000_000, "a positive number of seconds up to 2147483 (PostgreSQL's limit)"],
      statement_timeout: [-1, "a positive number of seconds up to 2147483 (PostgreSQL's limit)"],
      pool_size: [0, "a whole number from 1 to 262143 (PostgreSQL's most connections)"],
      port: [70_000, "a whole number from 1 to 65535 (a TCP port)"],
      max_result_bytes: [268_435_456, "a whole number from 1 to 268435455 (jsonb's limit)"],
      asynchronous_completion: ["no", "true or false"],
      host: [5, "a string"]
    }.each do |name, (value, expected)|
      before = config.public_send(name)
      message = "#{name} must be #{expected}, got #{value.inspect}"
      expect { config.public_send("#{name}=", value) }
        .to raise_error(IdempotentJob::ConfigurationError, /\A#{Regexp.escape(message)}\z/)
      expect(config.public_send(name)).to eq(before)
    end
    expect { config.connect_timeout = nil }
      .to raise_error(IdempotentJob::ConfigurationError, /connect_timeout must be .* got nil\z/)
    expect { config.application_name = "" }
      .to raise_error(IdempotentJob::ConfigurationError, /\Aapplication_name must not be empty\z/)
    expect { config.password = 12_345 }
      .to raise_error(IdempotentJob::ConfigurationError, /\Apassword must be a string, got \[REDACTED\]\z/)
    # A NUL cannot travel in a connection's startup or password message: refused where it
    # is assigned (it was accepted, then every connect failed as a retryable
    # ConnectionError "string contains embedded null" after retrying for the deadline).
    { application_name: "a\0b", user: "u\0", dbname: "d\0", host: "h\0" }.each do |name, value|
      expect { config.public_send("#{name}=", value) }
        .to raise_error(IdempotentJob::ConfigurationError, /\A#{name} must be a string without a NUL character/)
    end
    expect { config.password = "s3cr\0t" }
      .to raise_error(IdempotentJob::ConfigurationError, /without a NUL character.*got \[REDACTED\]\z/)
    url_config = IdempotentJob::Configuration.new.tap { |c| c.database_url = "postgres://h/db?application_name=a%00b" }
    expect { IdempotentJob::Native::Store.new(url_config.to_native_json) }
      .to raise_error(IdempotentJob::ConfigurationError,
                      /\Adatabase_url's application_name must be a string without a NUL/)
    config.connect_timeout = 315_360_000 # ten years: the longest
    config.pool_size = nil # unset: decided at connection time
    expect(config.connect_timeout).to eq(315_360_000)
    expect(config.pool_size).to be_nil
  end

  it "takes the connection settings' names and defaults, and the pool size of an unset pool_size, from the core" do
    expect(described_class::NATIVE_DEFAULTS.keys.map(&:to_s))
      .to eq(IdempotentJob::Native.connection_settings - ["database_url"])
    expect(described_class::CORE_DEFAULTS.keys).to match_array(IdempotentJob::Native.connection_settings)
    expect(IdempotentJob::Native.pool_size_for(nil)).to eq(described_class::CORE_DEFAULTS.fetch("pool_size"))
    expect(IdempotentJob::Native.pool_size_for(20)).to eq(25)
  end

  it "skips an empty IDEMPOTENT_JOB_DATABASE_URL for DATABASE_URL, as Python does (the core's rule)" do
    ENV["IDEMPOTENT_JOB_DATABASE_URL"] = ""
    ENV["DATABASE_URL"] = "postgres://b/db"
    expect(config.database_url).to eq("postgres://b/db")
    ENV["DATABASE_URL"] = ""
    expect(config.database_url).to be_nil
  end

  it "rejects bad pool settings at configure time, naming the setting" do
    expect do
      IdempotentJob.configure do |c|
        c.database_url = SpecServices.database_url
        c.checkout_timeout = -1
      end
    end.to raise_error(IdempotentJob::ConfigurationError, /checkout_timeout/)
  end
end

RSpec.describe "IdempotentJob.configure" do
  it "names the setting for a bad value of any type, and keeps the previous settings" do
    {
      pool_size: -1, connect_timeout: "5", application_name: 5, port: 70_000, heartbeat: "yes", logger: 5
    }.each do |name, value|
      expect { IdempotentJob.configure(name => value) }
        .to raise_error(IdempotentJob::ConfigurationError, /#{name}/)
    end
    expect(IdempotentJob.configuration.pool_size).to be_nil
    expect(IdempotentJob.record("Nothing", "1")).to be_nil # still usable
  end
end
