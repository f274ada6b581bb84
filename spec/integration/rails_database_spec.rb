# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"
require "pg"
require "uri"

# A real Rails app (the host's railties and ActiveRecord) whose database is
# config/database.yml alone: no DATABASE_URL, no IDEMPOTENT_JOB_DATABASE_URL, nothing in
# IdempotentJob.configure about the database. Its ActiveJob runs a protected job
# through the gem, whose idempotency record must land in the suite's PostgreSQL.
RSpec.describe "A Rails app configured by config/database.yml alone", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:app) { File.join(root, "tmp", "rails-yml-app") }
  let(:suite) { URI(SpecServices.database_url) }
  let(:socket_dir) do
    conn = PG.connect(SpecServices.database_url)
    conn.exec("SHOW unix_socket_directories").getvalue(0, 0).split(",").first.strip
  ensure
    conn&.close
  end

  # The suite's database by its fields, as a database.yml names it.
  def suite_fields(host: suite.host)
    { "adapter" => "postgresql", "host" => host, "port" => suite.port,
      "database" => suite.path.delete_prefix("/"), "username" => suite.user || "postgres" }.compact
  end

  # Writes the app: `database` is the development entry of database.yml; `settings`
  # lines go into the application's class body.
  def write_app(database, settings: "")
    FileUtils.rm_rf(app)
    FileUtils.mkdir_p(File.join(app, "config"))
    File.write(File.join(app, "config", "database.yml"), YAML.dump("development" => database))
    write_adapter
    write_application(settings)
    write_script
  end

  def write_adapter
    # An adapter that is not PostgreSQL's, loadable without its gem (the host has no
    # sqlite3): ActiveRecord loads the adapter of the primary database around each job.
    FileUtils.mkdir_p(File.join(app, "lib", "active_record", "connection_adapters"))
    File.write(File.join(app, "lib", "active_record", "connection_adapters", "spec_sql_adapter.rb"), <<~RUBY)
      module ActiveRecord
        module ConnectionHandling
          def spec_sql_connection(_config) = raise("the spec's adapter never connects")
        end

        module ConnectionAdapters
          class SpecSqlAdapter < AbstractAdapter; end
        end
      end
    RUBY
  end

  def write_application(settings)
    File.write(File.join(app, "config", "application.rb"), <<~RUBY)
      $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
      require "rails"
      require "active_record/railtie"
      require "active_job/railtie"
      require "idempotent_job"
      require "idempotent_job/active_job"
      if ActiveRecord::ConnectionAdapters.respond_to?(:register) # Rails 7.2
        ActiveRecord::ConnectionAdapters.register("spec_sql", "ActiveRecord::ConnectionAdapters::SpecSqlAdapter",
                                                  "active_record/connection_adapters/spec_sql_adapter")
      end

      class SpecYmlApp < Rails::Application
        config.root = #{app.inspect}
        config.eager_load = false
        config.logger = Logger.new(File::NULL)
        config.active_job.queue_adapter = :inline
        config.idempotent_job.logger = Logger.new($stdout, formatter: ->(_s, _t, _p, msg) { "log: \#{msg}\\n" })
        #{settings}
      end
    RUBY
    File.write(File.join(app, "config", "environment.rb"), <<~RUBY)
      require_relative "application"
      Rails.application.initialize!
    RUBY
  end

  def write_script
    File.write(File.join(app, "run.rb"), <<~RUBY)
      require_relative "config/environment"
      class YmlChargeJob < ActiveJob::Base
        include IdempotentJob::ActiveJob
        idempotency key: :order_id

        def perform(order_id)
          puts "charged \#{order_id}"
        end
      end
      begin
        2.times { YmlChargeJob.perform_later(ARGV.fetch(0).to_i) }
        puts "status=\#{IdempotentJob.record("YmlChargeJob", ARGV.fetch(0).to_i).status}"
      rescue IdempotentJob::ConfigurationError => e
        puts "ConfigurationError: \#{e.message}"
        exit 2
      end
    RUBY
  end

  def run_app(order_id, env = {})
    Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), "RAILS_ENV" => "development", "DATABASE_URL" => nil,
                      "IDEMPOTENT_JOB_DATABASE_URL" => nil, "PGHOST" => nil, **env },
                    "ruby", "run.rb", order_id.to_s, chdir: app)
  end

  it "keeps its idempotency records in database.yml's primary database, and says so" do
    write_app(suite_fields)
    out, status = run_app(7101)
    expect(status).to be_success, out
    expect(out.scan("charged 7101").size).to eq(1), out
    expect(out).to include("status=completed")
    expect(out).to match(%r{log: idempotent_job: database from config/database\.yml .*primary.*development})
    expect(IdempotentJob.record("YmlChargeJob", 7101)).to have_attributes(status: :completed)
  end

  it "reaches a Unix-socket host, named or left to libpq (PGHOST), as ActiveRecord does" do
    write_app(suite_fields(host: socket_dir))
    out, status = run_app(7102)
    expect(status).to be_success, out
    expect(IdempotentJob.record("YmlChargeJob", 7102)).to have_attributes(status: :completed)

    write_app(suite_fields(host: nil))
    out, status = run_app(7103, "PGHOST" => socket_dir)
    expect(status).to be_success, out
    expect(IdempotentJob.record("YmlChargeJob", 7103)).to have_attributes(status: :completed)
  end

  it "takes libpq's default socket directory for an entry without host, and keeps the settings that are set" do
    # No server listens there on the suite's port: the connection fails within the
    # deadline set (a setting that does not name the database), after the log line.
    write_app(suite_fields(host: nil), settings: "config.idempotent_job.deadline = 1")
    out, status = run_app(7107)
    expect(status).not_to be_success, out
    expect(out).to include("host /var/run/postgresql, port #{suite.port}", "deadline of 1 s")
  end

  it "reads a port as libpq does, in decimal: a leading zero is no octal number" do
    # PGPORT=027260 (or port: "027260") is libpq's port 27260; Integer() read it as octal
    # (12208) and the gem connected elsewhere.
    write_app(suite_fields.except("port"), settings: "config.idempotent_job.deadline = 2")
    out, status = run_app(7108, "PGPORT" => "0#{suite.port}")
    expect(status).to be_success, out
    expect(out).to include("port #{suite.port}")
    expect(IdempotentJob.record("YmlChargeJob", 7108)).to have_attributes(status: :completed)
  end

  it "reads a port as libpq does: digits (signed, between spaces); refuses others naming the entry" do
    # libpq (so ActiveRecord) takes " 27260" and "+27260" but refuses "27_260" and "27260.0";
    # Integer(port, 10) took "27_260" as 27260 and gave the gem a database Rails cannot reach.
    write_app(suite_fields.except("port"), settings: "config.idempotent_job.deadline = 2")
    out, status = run_app(7109, "PGPORT" => " +#{suite.port} ")
    expect(status).to be_success, out
    expect(out).to include("port #{suite.port}")
    bad = "#{suite.port.to_s[0, 2]}_#{suite.port.to_s[2..]}"
    out, status = run_app(7110, "PGPORT" => bad)
    expect(status).not_to be_success, out
    expect(out).to include("PGPORT (libpq's port for config/database.yml's primary database for development, " \
                           "which gives none) is #{bad.inspect}: not a port as libpq reads it")
    write_app(suite_fields.merge("port" => "#{suite.port}.0"))
    out, status = run_app(7111)
    expect(status).not_to be_success, out
    expect(out).to include("config/database.yml's primary database for development has port " \
                           "#{"#{suite.port}.0".inspect}: not a port as libpq reads it")
    expect(IdempotentJob.record("YmlChargeJob", 7110)).to be_nil
  end

  it "takes a url: entry as the URL" do
    write_app({ "adapter" => "postgresql", "url" => SpecServices.database_url })
    out, status = run_app(7104)
    expect(status).to be_success, out
    expect(IdempotentJob.record("YmlChargeJob", 7104)).to have_attributes(status: :completed)
  end

  it "lets an explicit database_url win over database.yml" do
    write_app(suite_fields.merge("database" => "no_such_database_here"),
              settings: "config.idempotent_job.database_url = #{SpecServices.database_url.inspect}")
    out, status = run_app(7105)
    expect(status).to be_success, out
    expect(out).not_to include("config/database.yml")
    expect(IdempotentJob.record("YmlChargeJob", 7105)).to have_attributes(status: :completed)
  end

  it "refuses a database.yml whose adapter is not PostgreSQL, naming the setting to use instead" do
    write_app({ "adapter" => "spec_sql", "database" => "db/development.db" })
    out, status = run_app(7106)
    expect(status.exitstatus).to eq(2), out
    expect(out).to include("ConfigurationError:", '"spec_sql"', "postgresql", "database_url")
    expect(out).not_to include("charged")
  end
end
