# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rubygems/package"
require "tmpdir"

# No queue library is a dependency of the gem: the gemspec (and the built gem) name
# none; each door checks its own when required and says what to add to the Gemfile;
# and an app without Sidekiq (a clean process where `require "sidekiq"` raises
# LoadError) runs the ActiveJob door on Delayed Job, the plain API, the rake tasks and
# the web page.
RSpec.describe "Optional queue libraries", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:queue_gems) { %w[sidekiq redis redis-client connection_pool activejob] }

  def ruby(*args, env: {})
    Open3.capture2e({ "DATABASE_URL" => SpecServices.database_url }.merge(env), RbConfig.ruby, "-I",
                    File.join(root, "lib"), *args, chdir: root)
  end

  it "the gemspec and the gem `gem build` makes have no runtime dependency on a queue library" do
    spec = Gem::Specification.load(File.join(root, "idempotent_job.gemspec"))
    expect(spec.runtime_dependencies.map(&:name) & queue_gems).to eq([])

    Dir.mktmpdir do |dir|
      path = File.join(dir, "idempotent_job.gem")
      out, status = Open3.capture2e("gem", "build", "idempotent_job.gemspec", "--output", path, chdir: root)
      expect(status).to be_success, out
      built = Gem::Package.new(path).spec
      expect(built.runtime_dependencies.map(&:name) & queue_gems).to eq([])
    end
  end

  it "without Sidekiq: the ActiveJob door on Delayed Job, the plain API, the rake tasks and the web page work" do
    out, status = ruby("-r", "./spec/support/hide_sidekiq.rb", "spec/support/no_sidekiq_app.rb")
    expect(status).to be_success, out
    expect(out).to include("sidekiq door: idempotent_job/sidekiq needs Sidekiq >= 6.4, < 9, but cannot load it " \
                           "(cannot load such file -- sidekiq (hidden by spec/support/hide_sidekiq.rb)): add " \
                           "`gem \"sidekiq\", \">= 6.4\", \"< 9\"` to your Gemfile")
    expect(out).to include("ok: active_job on delayed_job: 1 run, record completed\n")
    expect(out).to include("ok: active_job enqueue of the completed operation: false\n")
    expect(out).to include("ok: plain ran, completed\n")
    expect(out).to match(/^ok: rake idempotent_job: (no held operations|\d+ held)/)
    completed = 'idempotent_job_records{job_type="NoSidekiqChargeJob",status="completed"}'
    expect(out).to match(/^ok: web 200, metrics 200: #{Regexp.escape(completed)} [1-9]/)
    expect(out).to include("ok: loaded from sidekiq or redis gems: 0, Sidekiq constant: nil\n")
  end

  it "a Sidekiq or ActiveJob the door does not support: one DependencyError naming the Gemfile line" do
    old_sidekiq = 'require "sidekiq"; Sidekiq.send(:remove_const, :VERSION); Sidekiq::VERSION = "6.3.1"; begin; ' \
                  'require "idempotent_job/sidekiq"; rescue IdempotentJob::DependencyError => e; puts e.message; end'
    out, = ruby("-e", old_sidekiq)
    expect(out).to include(%(idempotent_job/sidekiq needs Sidekiq >= 6.4, < 9, but this process has Sidekiq 6.3.1: ) +
                           %(add `gem "sidekiq", ">= 6.4", "< 9"` to your Gemfile))

    old_active_job = 'require "active_job"; def ActiveJob.gem_version = Gem::Version.new("5.2.8"); ' \
                     'begin; require "idempotent_job/active_job"; rescue LoadError => e; puts e.class, e.message; end'
    out, = ruby("-e", old_active_job)
    expect(out).to include("IdempotentJob::DependencyError\nidempotent_job/active_job needs ActiveJob >= 6.1, < 9, " \
                           "but this process has ActiveJob 5.2.8: add `gem \"activejob\", \">= 6.1\", \"< 9\"`")

    no_active_job = 'module Kernel; alias plain_require require; def require(n) = n == "active_job" ? ' \
                    'raise(LoadError, "cannot load such file -- active_job") : plain_require(n); end; ' \
                    'begin; require "idempotent_job/active_job"; rescue LoadError => e; puts e.message; end'
    out, = ruby("-e", no_active_job)
    expect(out).to include("idempotent_job/active_job needs ActiveJob >= 6.1, < 9, but cannot load it " \
                           "(cannot load such file -- active_job): add `gem \"activejob\"")
  end

  it "a door's constant used without its require names the require to add" do
    forgot = 'require "idempotent_job"; require "active_job"; p defined?(IdempotentJob::Sidekiq); ' \
             "begin; Class.new(ActiveJob::Base) { include IdempotentJob::ActiveJob }; " \
             "rescue NameError => e; puts e.class, e.message.lines.first, e.name; end; " \
             "begin; IdempotentJob::Sidekiq::ServerMiddleware; " \
             "rescue NameError => e; puts e.message.lines.first; end; " \
             "begin; IdempotentJob::Nonesuch; rescue NameError => e; puts e.message.lines.first; end"
    out, status = ruby("-e", forgot)
    expect(status).to be_success, out
    expect(out).to start_with("nil\n")
    expect(out).to include("NameError\nuninitialized constant IdempotentJob::ActiveJob: the ActiveJob door is " \
                           "loaded by `require \"idempotent_job/active_job\"` (e.g. in " \
                           "config/initializers/idempotent_job.rb)\nActiveJob\n")
    expect(out).to include("uninitialized constant IdempotentJob::Sidekiq: the Sidekiq door is loaded by " \
                           "`require \"idempotent_job/sidekiq\"` (e.g. in config/initializers/idempotent_job.rb or " \
                           "your Sidekiq boot file)\n")
    expect(out).to include("uninitialized constant IdempotentJob::Nonesuch\n")
  end
end
