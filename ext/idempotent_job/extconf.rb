# frozen_string_literal: true

# Writes the Makefile RubyGems runs when the gem is installed: `make` builds the
# native extension with cargo (release profile), `make install` copies it to where
# RubyGems collects it (sitearchdir/idempotent_job/idempotent_job.so) and removes
# cargo's build directory so the installed gem stays small.
require "rbconfig"
require "shellwords"

crate_dir = __dir__
root = File.expand_path("../..", crate_dir)
target_dir = ENV.fetch("CARGO_TARGET_DIR", File.join(crate_dir, "target"))
private_target = !ENV.key?("CARGO_TARGET_DIR")
dlext = RbConfig::CONFIG.fetch("DLEXT")
lib = File.join(target_dir, "release", "libidempotent_job.so")
dest = File.join(RbConfig::CONFIG.fetch("sitearchdir"), "idempotent_job")
cargo = ENV.fetch("CARGO", "cargo")

File.write("Makefile", <<~MAKE)
  all:
  \t#{cargo} build --release --locked --manifest-path #{File.join(root, "Cargo.toml").shellescape} -p idempotent_job --target-dir #{target_dir.shellescape}

  install: all
  \tmkdir -p #{dest.shellescape}
  \tcp #{lib.shellescape} #{File.join(dest, "idempotent_job.#{dlext}").shellescape}
  #{private_target ? "\trm -rf #{target_dir.shellescape}" : ""}

  clean:

  .PHONY: all install clean
MAKE
