# frozen_string_literal: true

require_relative "lib/idempotent_job/version"

Gem::Specification.new do |spec|
  spec.name = "idempotent_job"
  spec.version = IdempotentJob::VERSION
  spec.authors = ["idempotent_job developers"]
  spec.summary = "Durable idempotency records in PostgreSQL for Sidekiq jobs delivered at least once"
  spec.description = "Claims each business operation (order number, payment id) atomically in " \
                     "PostgreSQL before a Sidekiq job runs, so retries, re-enqueues and restarts " \
                     "do not repeat its effect. Rust core (tokio-postgres, deadpool), Ruby facade."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"

  spec.files = Dir[
    "lib/**/*.rb", "lib/idempotent_job/web/views/*.erb",
    "ext/idempotent_job/{Cargo.toml,extconf.rb}", "ext/idempotent_job/src/**/*.rs",
    "crates/core/{Cargo.toml,build.rs}", "crates/core/src/**/*.rs",
    # The Python extension crate is a workspace member: cargo reads its manifest (and
    # sources) to load the workspace, but the gem's build never compiles it.
    "python/Cargo.toml", "python/src/**/*.rs",
    "migrations/*.sql", "Cargo.toml", "Cargo.lock", "README.md", "LICENSE"
  ]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/idempotent_job/extconf.rb"]
  # This source gem builds the extension when installed (the platform gems need neither).
  spec.requirements = ["Rust 1.92 or later (cargo, rustc) and libclang, to build the native extension"]

  spec.add_dependency "sidekiq", ">= 6.4", "< 9"
  spec.metadata["rubygems_mfa_required"] = "true"
end
