# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"
require "rubygems/package"
require "tmpdir"

# The gems as users get them: the source gem (`gem build`; `gem install` compiles the
# extension with cargo) and the platform gem (`rake native:gem`; nothing to compile),
# each installed into an empty GEM_HOME by bin/package-smoke and loaded from there; the
# extension's naming on other platforms; the loader's order; the rake tasks from a
# plain Rakefile.
RSpec.describe "The packaged gems", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:work) { File.join(root, "tmp", "packaging") }
  let(:abi) { RUBY_VERSION[/\A\d+\.\d+/] }
  # bin/package-smoke's and the Rakefile's folders: of their own for a second Ruby on this
  # checkout (IDEMPOTENT_JOB_ABI_DIR, the testing leg's Ruby 3.3).
  let(:second_ruby) { !ENV["IDEMPOTENT_JOB_ABI_DIR"].to_s.empty? }
  let(:smoke) { File.join(root, "tmp", second_ruby ? "package-smoke-#{abi}" : "package-smoke") }
  let(:pkg) { File.join(root, "pkg", *(second_ruby ? [abi] : [])) }
  let(:dlext) { RbConfig::CONFIG.fetch("DLEXT") }
  let(:platform) { IdempotentJob.gem_platform }

  def run!(env, *cmd, chdir: root)
    out, status = Open3.capture2e(env, *cmd, chdir:)
    expect(status).to be_success, "#{cmd.join(" ")} failed:\n#{out}"
    out
  end

  def package_smoke(*steps, env: {})
    run!({ "DATABASE_URL" => SpecServices.database_url }.merge(env), File.join(root, "bin/package-smoke"), *steps)
  end

  def fresh_database(name)
    admin = PG.connect(SpecServices.database_url)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP DATABASE IF EXISTS #{admin.quote_ident(name)}")
    admin.exec("CREATE DATABASE #{admin.quote_ident(name)}")
    admin.close
    SpecServices.database_url.sub(%r{/[^/?]+(\?|\z)}, "/#{name}\\1")
  end

  it "the source gem builds, installs with an extension built by cargo, loads from the install and runs a delivery" do
    # Sharing cargo's build directory with the checkout keeps this quick (the gem's own
    # crate is still compiled from the installed sources); CI's smoke run builds cold.
    target = ENV.fetch("CARGO_TARGET_DIR", File.join(root, "target"))
    out = package_smoke("source", env: { "CARGO_TARGET_DIR" => target })
    home = File.join(smoke, "source", "home")
    expect(out).to match(%r{^source gem: loaded #{Regexp.escape(home)}/\S+/idempotent_job\.#{dlext}$})
    expect(out).to include("source gem: ran\n")
    expect(out).to match(/^source gem: installed footprint [\d.]+ MB/)
  end

  it "the platform gem holds this Ruby's build and no Rust, and installs and runs a delivery with no cargo on PATH" do
    out = package_smoke("platform")
    home = File.join(smoke, "platform", "home")
    expect(out).to include("platform gem: loaded #{home}/gems/idempotent_job-#{IdempotentJob::VERSION}-#{platform}/" \
                           "lib/idempotent_job/#{abi}/idempotent_job.#{dlext}\n")
    expect(out).to include("platform gem: ran\n")
    expect(out).to match(/^platform gem: installed footprint [\d.]+ MB/)

    spec = Gem::Package.new(File.join(pkg, "idempotent_job-#{IdempotentJob::VERSION}-#{platform}.gem")).spec
    expect(spec.platform.to_s).to eq(platform)
    expect(spec.extensions).to be_empty
    expect(spec.requirements).to be_empty
    expect(spec.files).to include("lib/idempotent_job/#{abi}/idempotent_job.#{dlext}",
                                  "migrations/V1__create_idempotent_job_records.sql")
    expect(spec.files.grep(/\.rs\z|Cargo|extconf|\Aext/)).to be_empty
    # This Ruby's build and any other ABI's built in the checkout (3.3 by the testing leg):
    # the gem takes each of them and not the Ruby after the newest.
    abis = spec.files.filter_map { |f| f[%r{\Alib/idempotent_job/(\d+\.\d+)/idempotent_job\.}, 1] }
    expect(abis).to include(abi)
    versions = abis.map { |a| Gem::Version.new("#{a}.0") }
    versions.each { |v| expect(spec.required_ruby_version).to be_satisfied_by(v) }
    expect(spec.required_ruby_version).not_to be_satisfied_by(Gem::Version.new("#{versions.max.bump}.0"))
  end

  it "the source gem without cargo fails with one message saying what to install or which platform gem to use" do
    out = package_smoke("no-cargo")
    message = out[/^no-cargo: gem install failed with: (.*)$/, 1]
    expect(message).to start_with("idempotent_job #{IdempotentJob::VERSION}: cargo was not found")
    expect(message).to include("Rust 1.92 or later", "libclang",
                               "`gem install idempotent_job --platform #{platform}`")
  end

  it "names the library as the target does (cargo's lib*.so, .dylib, *.dll), installed as idempotent_job.<DLEXT>" do
    FileUtils.mkdir_p(work)
    { "x86_64-unknown-linux-gnu" => ["libidempotent_job.so", "so"],
      "aarch64-apple-darwin" => ["libidempotent_job.dylib", "bundle"],
      "x86_64-pc-windows-msvc" => ["idempotent_job.dll", "so"] }.each do |triple, (built, ruby_dlext)|
      dir = File.join(work, "extconf-#{triple}")
      FileUtils.rm_rf(dir)
      FileUtils.mkdir_p(dir)
      # What that platform's Ruby says, the way RubyGems' siteconf sets sitearchdir.
      File.write(File.join(dir, "siteconf.rb"), <<~RUBY)
        require "rbconfig"
        RbConfig::CONFIG["DLEXT"] = RbConfig::MAKEFILE_CONFIG["DLEXT"] = #{ruby_dlext.dump}
        RbConfig::CONFIG["sitearchdir"] = RbConfig::MAKEFILE_CONFIG["sitearchdir"] = "installed"
      RUBY
      run!({ "CARGO_BUILD_TARGET" => triple, "CARGO_TARGET_DIR" => File.join(dir, "target") },
           RbConfig.ruby, "-r./siteconf", File.join(root, "ext/idempotent_job/extconf.rb"), chdir: dir)
      makefile = File.read(File.join(dir, "Makefile"))
      expect(makefile).to include("--target #{triple}")
      expect(makefile).to include("cp #{dir}/target/#{triple}/release/#{built} $(DEST).tmp")
      expect(makefile).to include("DEST = $(sitearchdir)/idempotent_job/idempotent_job.#{ruby_dlext}\n")
      expect(makefile).to include("sitearchdir = installed\n")
      expect(makefile).not_to include("rm -rf") # CARGO_TARGET_DIR chose the build directory: kept
    end
  end

  it "loads the build for this Ruby's ABI first, the install-time build next, and says what to do without either" do
    so = File.join(root, "lib", "idempotent_job", *(second_ruby ? [abi] : []), "idempotent_job.#{dlext}")
    lib = File.join(work, "loader", "lib")
    FileUtils.rm_rf(File.dirname(lib))
    FileUtils.mkdir_p(File.join(lib, "idempotent_job", abi))
    %w[native.rb errors.rb gem_platform.rb].each do |file|
      FileUtils.cp(File.join(root, "lib", "idempotent_job", file), File.join(lib, "idempotent_job"))
    end
    load_native = ["ruby", "-I", lib, "-e", <<~RUBY]
      begin
        require "idempotent_job/native"
        puts $LOADED_FEATURES.grep(/idempotent_job\\.#{dlext}\\z/)
      rescue LoadError => e
        puts e.message
      end
    RUBY
    precompiled = File.join(lib, "idempotent_job", abi, "idempotent_job.#{dlext}")
    built = File.join(lib, "idempotent_job", "idempotent_job.#{dlext}")

    expect(run!({}, *load_native)).to include("precompiled for Ruby #{abi}", "built at install", "rake compile")
    FileUtils.cp(so, built)
    expect(run!({}, *load_native).strip).to eq(built)
    FileUtils.cp(so, precompiled)
    expect(run!({}, *load_native).strip).to eq(precompiled)
    File.write(precompiled, "not a shared library") # e.g. built for another libc: the next one loads
    expect(run!({}, *load_native).strip).to eq(built)
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
