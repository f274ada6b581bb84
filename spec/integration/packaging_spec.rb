# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"
require "tmpdir"

# The gem as users get it: built with `gem build`, installed with `gem install`
# (which compiles the extension), loaded from the installed copy, and its rake
# task run from a plain Rakefile.
RSpec.describe "The packaged gem", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:work) { File.join(root, "tmp", "packaging") }

  def run!(env, *cmd, chdir: root)
    out, status = Open3.capture2e(env, *cmd, chdir:)
    expect(status).to be_success, "#{cmd.join(" ")} failed:\n#{out}"
    out
  end

  def fresh_database(name)
    admin = PG.connect(SpecServices.database_url)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP DATABASE IF EXISTS #{admin.quote_ident(name)}")
    admin.exec("CREATE DATABASE #{admin.quote_ident(name)}")
    admin.close
    SpecServices.database_url.sub(%r{/[^/?]+(\?|\z)}, "/#{name}\\1")
  end

  it "builds, installs with a compiled extension, loads from the install and claims" do
    FileUtils.rm_rf(work)
    FileUtils.mkdir_p(work)
    gem_file = File.join(work, "idempotent_job.gem")
    run!({}, "gem", "build", "idempotent_job.gemspec", "--output", gem_file)
    home = File.join(work, "home")
    # Share cargo's dependency cache with the checkout; the gem's own crate is still
    # compiled from the installed sources.
    run!({ "CARGO_TARGET_DIR" => File.join(root, "target") },
         "gem", "install", "--local", "--ignore-dependencies", "--no-document", "--install-dir", home, gem_file)
    script = <<~'RUBY'
      require "idempotent_job"
      IdempotentJob.configure { |c| c.database_url = ENV.fetch("DATABASE_URL") }
      IdempotentJob.migrate!
      so = $LOADED_FEATURES.grep(/idempotent_job\.so/).first
      puts "loaded #{so}"
      puts IdempotentJob.store.claim({ job_type: "Packaged", operation_key: rand(1 << 40).to_s, lease: 5.0 })[:decision]
    RUBY
    gem_path = [home, *Gem.path].join(File::PATH_SEPARATOR)
    out = run!({ "GEM_HOME" => home, "GEM_PATH" => gem_path, "RUBYLIB" => nil, "RUBYOPT" => nil },
               "ruby", "-e", script, chdir: work)
    expect(out).to include("loaded #{home}")
    expect(out.lines.last.strip).to eq("claimed")
  end

  it "creates the schema with `rake idempotent_job:migrate` from a plain Rakefile, and is a no-op the second time" do
    FileUtils.mkdir_p(work)
    File.write(File.join(work, "Rakefile"), %(require "idempotent_job/rake_tasks"\n))
    env = { "DATABASE_URL" => fresh_database("idempotent_job_rake"), "RUBYLIB" => File.join(root, "lib") }
    expect(run!(env, "rake", "idempotent_job:migrate",
                chdir: work)).to include("applied V1__create_idempotent_job_records")
    expect(run!(env, "rake", "idempotent_job:migrate", chdir: work)).to include("schema is up to date")
    expect(run!(env, "rake", "idempotent_job:sql", chdir: work)).to include("CREATE TABLE idempotent_job_records")
  end
end
