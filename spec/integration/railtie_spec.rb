# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"

# A minimal Rails app (Debian's railties) with the gem: its tasks are listed, and
# `config.idempotent_job` reaches IdempotentJob.configure before they run.
RSpec.describe "The Railtie", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:app) { File.join(root, "tmp", "rails-app") }

  before do
    FileUtils.rm_rf(app)
    FileUtils.mkdir_p(File.join(app, "config"))
    File.write(File.join(app, "config", "application.rb"), <<~RUBY)
      require "rails"
      require "idempotent_job"

      class SpecApp < Rails::Application
        config.root = #{app.inspect}
        config.eager_load = false
        config.logger = Logger.new(File::NULL)
        config.idempotent_job.lease = 42
        config.idempotent_job.database_url = #{SpecServices.database_url.inspect}
      end
    RUBY
    File.write(File.join(app, "config", "environment.rb"), <<~RUBY)
      require_relative "application"
      Rails.application.initialize!
    RUBY
    File.write(File.join(app, "Rakefile"), <<~RUBY)
      require_relative "config/application"
      Rails.application.load_tasks
      task(:show_lease) { puts "lease=\#{IdempotentJob.configuration.lease}" }
      task show_lease: :environment
    RUBY
  end

  # Boots the app and says whether the Sidekiq door is installed ("door=installed" or
  # "door=missing"), with what the boot logged.
  def sidekiq_door
    File.write(File.join(app, "Rakefile"), <<~RUBY, mode: "a")
      task(:door) { puts "door=\#{defined?(IdempotentJob::Sidekiq::ServerMiddleware) ? "installed" : "missing"}" }
      task door: :environment
    RUBY
    out, status = rake("door")
    expect(status).to be_success, out
    out
  end

  def rake(*args)
    # No DATABASE_URL: the tasks can only reach the database through config.idempotent_job.
    Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), "RAILS_ENV" => "development", "DATABASE_URL" => nil,
                      "IDEMPOTENT_JOB_DATABASE_URL" => nil }, "rake", *args, chdir: app)
  end

  it "lists the gem's tasks" do
    out, status = rake("-T")
    expect(status).to be_success, out
    expect(out).to include("idempotent_job:migrate", "idempotent_job:purge", "idempotent_job:held",
                           "idempotent_job:resolve", "idempotent_job:sql")
  end

  it "applies config.idempotent_job, and the tasks run after the app's environment" do
    out, status = rake("show_lease")
    expect(status).to be_success, out
    expect(out).to include("lease=42")
    out, status = rake("idempotent_job:migrate")
    expect(status).to be_success, out
    expect(out).to include("schema is up to date").or include("applied")
  end

  it "installs the Sidekiq door when the app loads Sidekiq, whatever the require order" do
    application = File.join(app, "config", "application.rb")
    # Sidekiq loaded after the gem, as a Gemfile listing idempotent_job first does.
    File.write(application, File.read(application).sub(%(require "idempotent_job"\n),
                                                       %(require "idempotent_job"\nrequire "sidekiq"\n)))
    out = sidekiq_door
    expect(out).to include("door=installed")
  end

  it "installs the Sidekiq door when Sidekiq is first required in config/initializers" do
    # `gem "sidekiq", require: false` in the Gemfile, required by an initializer of the app.
    FileUtils.mkdir_p(File.join(app, "config", "initializers"))
    File.write(File.join(app, "config", "initializers", "sidekiq.rb"), %(require "sidekiq"\n))
    out = sidekiq_door
    expect(out).to include("door=installed")
  end

  # A Sidekiq outside the door's versions (the Railtie cannot install the door) is said at
  # boot, not left silent: its jobs' sidekiq_options idempotency_key would run unguarded.
  # The app defines Sidekiq::VERSION itself, as an old or future Sidekiq would.
  it "warns at boot when the app loads a Sidekiq the door does not support" do
    application = File.join(app, "config", "application.rb")
    unsupported = %(require "idempotent_job"\nmodule Sidekiq; VERSION = "9.1.0"; end\n)
    File.write(application, File.read(application).sub(%(require "idempotent_job"\n), unsupported))
    out = sidekiq_door
    expect(out).to include("door=missing")
    expect(out).to include("Sidekiq 9.1.0", "idempotency_key", 'gem "sidekiq", ">= 6.4", "< 9"')
  end
end
