# frozen_string_literal: true

require "spec_helper"
require "English"
require "fileutils"

# TLS with rustls against a PostgreSQL started with ssl=on and a certificate from a
# throwaway CA that names only "localhost".
RSpec.describe "TLS", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:dir) { File.join(root, "tmp", "tls-services") }
  let(:certs) { File.join(root, "tmp", "tls-certs") }
  let(:port) { 25_347 }

  def openssl(*args)
    system("openssl", *args, out: File::NULL, err: File::NULL, exception: true)
  end

  def make_certificates
    FileUtils.rm_rf(certs)
    FileUtils.mkdir_p(certs)
    Dir.chdir(certs) do
      openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=idempotent_job test CA",
              "-keyout", "ca.key", "-out", "ca.pem")
      openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
              "-out", "server.csr")
      File.write("san.ext", "subjectAltName=DNS:localhost\n")
      openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
              "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    end
    File.chmod(0o600, File.join(certs, "server.key"))
    FileUtils.chown_R("postgres", "postgres", certs) if Process.uid.zero?
  end

  def services(command)
    env = { "PG_PORT" => port.to_s, "REDIS_PORT" => "63817",
            "PG_EXTRA_OPTS" => "-c ssl=on -c ssl_cert_file=#{certs}/server.pem -c ssl_key_file=#{certs}/server.key" }
    out = IO.popen(env, [File.join(root, "bin/services"), command, dir], &:read)
    raise "bin/services #{command} failed" unless $CHILD_STATUS.success?

    out
  end

  before do
    services("stop")
    FileUtils.rm_rf(dir)
    make_certificates
    services("start")
  end

  after { services("stop") }

  def use(host:, **tls)
    SpecServices.configure_gem!(database_url: "postgres://postgres@#{host}:#{port}/idempotent_job", connect_timeout: 3,
                                **tls)
    IdempotentJob.migrate!
    deliver_once("Tls", "k-#{rand(1 << 30)}").decision
  end

  def encrypted?
    admin = PG.connect(host: "127.0.0.1", port:, user: "postgres", dbname: "idempotent_job", sslmode: "disable")
    admin.exec("SELECT bool_and(s.ssl)::text FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) " \
               "WHERE a.application_name = 'idempotent_job'").getvalue(0, 0) == "true"
  ensure
    admin&.close
  end

  it "require encrypts without checking the certificate" do
    expect(use(host: "127.0.0.1", sslmode: "require")).to eq(:ran)
    expect(encrypted?).to be(true)
  end

  it "verify-full checks the chain and the host name; verify-ca only the chain" do
    expect(use(host: "localhost", sslmode: "verify-full", sslrootcert: "#{certs}/ca.pem")).to eq(:ran)
    expect(encrypted?).to be(true)
    expect(use(host: "127.0.0.1", sslmode: "verify-ca", sslrootcert: "#{certs}/ca.pem")).to eq(:ran)
  end

  it "verify-full fails clearly for a host name the certificate does not name" do
    expect { use(host: "127.0.0.1", sslmode: "verify-full", sslrootcert: "#{certs}/ca.pem") }
      .to raise_error(IdempotentJob::ConnectionError, /certificate/i)
  end

  it "verify-full fails clearly for a certificate from an untrusted CA" do
    expect { use(host: "localhost", sslmode: "verify-full") }
      .to raise_error(IdempotentJob::ConnectionError, /UnknownIssuer.*set sslrootcert/)
  end

  it "never falls back to plaintext under require, in a URL or a key/value string" do
    plain = URI.parse(SpecServices.database_url)
    ["#{SpecServices.database_url}?sslmode=require",
     "host=#{plain.host} port=#{plain.port} user=postgres dbname=idempotent_job sslmode=require"].each do |url|
      # Refused connections are retried until the deadline: 2 s, not the default 10.
      SpecServices.configure_gem!(database_url: url, connect_timeout: 2, deadline: 2)
      expect { deliver_once("Tls", "plain") }.to raise_error(IdempotentJob::ConnectionError, /TLS/)
    end
  end

  it "cancels an interrupted statement over TLS too" do
    use(host: "127.0.0.1", sslmode: "require")
    key = "cancel-#{rand(1 << 30)}"
    stale_claim("Tls", key)
    admin = PG.connect(host: "127.0.0.1", port:, user: "postgres", dbname: "idempotent_job")
    admin.exec("BEGIN")
    admin.exec_params("SELECT 1 FROM idempotent_job_records WHERE job_type = 'Tls' AND operation_key = $1 FOR UPDATE",
                      [key])
    expect { Timeout.timeout(0.3) { deliver_once("Tls", key) } }.to raise_error(Timeout::Error)
    # The cancel goes out over TLS; an uncancelled statement would wait on the row lock.
    expect(gem_statements_running(admin)).to eq(0)
  ensure
    admin&.close
  end

  it "reads TLS settings from the URL, and reports a missing root file at first use, by name" do
    SpecServices.configure_gem!(database_url: "postgres://postgres@localhost:#{port}/idempotent_job" \
                                              "?sslmode=verify-full&sslrootcert=#{certs}/ca.pem")
    expect(IdempotentJob.migrate!).to be_an(Array)
    SpecServices.configure_gem!(database_url: "postgres://postgres@localhost:#{port}/idempotent_job" \
                                              "?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
    expect { IdempotentJob.migrate! }
      .to raise_error(IdempotentJob::ConfigurationError, %r{sslrootcert /nonexistent/ca.pem})
  end
end
