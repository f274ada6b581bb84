# frozen_string_literal: true

# Writes the Makefile that builds the native extension with cargo (release profile):
# RubyGems runs it when the source gem is installed, `rake compile` in a checkout.
#
# * `make` runs `cargo build`; `make install` copies cargo's library, named by the
#   target's conventions as rustc reports them (libidempotent_job.so on Linux,
#   libidempotent_job.dylib on macOS, idempotent_job.dll on Windows), to Ruby's name for
#   an extension, $(sitearchdir)/idempotent_job/idempotent_job.<DLEXT> (.so, .bundle), then
#   removes cargo's build directory so the installed gem stays small (unless
#   CARGO_TARGET_DIR chose one, which is left alone).
# * Environment: CARGO (the cargo to run), CARGO_TARGET_DIR, CARGO_BUILD_TARGET (a target
#   triple to cross-compile for; rb-sys-dock sets it), RUSTC.
# * Without cargo, or with a Rust older than the MSRV, it stops with one message saying
#   what to install, or which precompiled platform gem needs no Rust at all.
require "rbconfig"
require "shellwords"
require_relative "../../lib/idempotent_job/version"
require_relative "../../lib/idempotent_job/gem_platform"

# The oldest Rust that builds the extension: refinery 0.10's rust-version, the highest in
# Cargo.lock (cargo refuses an older one); also ext/idempotent_job/Cargo.toml's rust-version.
MSRV = "1.92"
def executable(name)
  return name if name.include?(File::SEPARATOR) && File.executable?(name)

  exts = [""] | [RbConfig::CONFIG["EXEEXT"].to_s]
  ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).each do |dir|
    exts.each do |ext|
      path = File.join(dir, "#{name}#{ext}")
      return path if File.file?(path) && File.executable?(path)
    end
  end
  nil
end

def stop_without_rust(problem)
  local = IdempotentJob.gem_platform
  abi = RUBY_VERSION[/\A\d+\.\d+/]
  prebuilt = IdempotentJob::PLATFORM_GEMS.map { |platform, abis| "#{platform} (Ruby #{abis.join(", ")})" }.join("; ")
  fits = IdempotentJob::PLATFORM_GEMS.fetch(local, []).include?(abi)
  choice = if fits
             "or install the precompiled gem for this machine, which needs no Rust: " \
               "`gem install idempotent_job --platform #{local}` (Bundler: " \
               "`bundle lock --add-platform #{local}`)"
           else
             "precompiled gems, which need no Rust, exist for #{prebuilt}; this machine is #{local}, Ruby #{abi}"
           end
  abort <<~MSG
    idempotent_job #{IdempotentJob::VERSION}: #{problem}. Building the native extension needs Rust #{MSRV} or later \
    (cargo and rustc, e.g. from https://rustup.rs) and libclang (Debian/Ubuntu: libclang-dev; Alpine: clang-dev; \
    macOS: the Xcode command line tools); #{choice}.
  MSG
end

cargo = ENV.fetch("CARGO", "cargo")
stop_without_rust("cargo was not found (looked for `#{cargo}` on PATH)") unless (cargo_path = executable(cargo))
rustc = ENV["RUSTC"] || [File.join(File.dirname(cargo_path), "rustc"), "rustc"].filter_map { |r| executable(r) }.first
rust_version = begin
  rustc && IO.popen([rustc, "--version"], err: File::NULL, &:read)[/\d+\.\d+\.\d+/]
rescue SystemCallError
  nil
end
stop_without_rust("rustc was not found (next to #{cargo_path} or on PATH)") unless rust_version
if Gem::Version.new(rust_version) < Gem::Version.new(MSRV)
  stop_without_rust("the Rust found is #{rust_version} (#{rustc})")
end

crate_dir = __dir__
root = File.expand_path("../..", crate_dir)
target_dir = ENV.fetch("CARGO_TARGET_DIR", File.join(crate_dir, "target"))
private_target = !ENV.key?("CARGO_TARGET_DIR")
triple = ENV.fetch("CARGO_BUILD_TARGET", "")
target_flags = triple.empty? ? [] : ["--target", triple]
# cargo's output name for a cdylib: rustc knows each target's prefix and suffix.
library = IO.popen([rustc, "--print", "file-names", "--crate-type", "cdylib", "--crate-name", "idempotent_job",
                    *target_flags, "-"], in: File::NULL, err: File::NULL, &:read).to_s.strip
abort "idempotent_job: `#{rustc} --print file-names` gave no library name" if library.empty?
built = File.join(target_dir, *(triple.empty? ? [] : [triple]), "release", library)
dlext = RbConfig::CONFIG.fetch("DLEXT")

File.write("Makefile", <<~MAKE)
  CARGO = #{cargo_path.shellescape}
  # `rake compile` clears it (a checkout may update Cargo.lock); installs never do.
  CARGO_FLAGS = --locked
  sitearchdir = #{RbConfig::CONFIG.fetch("sitearchdir").shellescape}
  DEST = $(sitearchdir)/idempotent_job/idempotent_job.#{dlext}

  all:
  \t$(CARGO) build --release $(CARGO_FLAGS) --manifest-path #{File.join(root, "Cargo.toml").shellescape} -p idempotent_job --target-dir #{target_dir.shellescape} #{target_flags.shelljoin}

  # Copy, then rename: a process that has the old library mapped keeps its own inode.
  install: all
  \tmkdir -p $(sitearchdir)/idempotent_job
  \tcp #{built.shellescape} $(DEST).tmp
  \tmv -f $(DEST).tmp $(DEST)
  #{private_target ? "\trm -rf #{target_dir.shellescape}" : ""}

  clean:

  .PHONY: all install clean
MAKE
