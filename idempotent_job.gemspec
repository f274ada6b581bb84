# frozen_string_literal: true

require_relative "lib/idempotent_job/version"

Gem::Specification.new do |spec|
  spec.name = "idempotent_job"
  spec.version = IdempotentJob::VERSION
  spec.authors = ["idempotent_job developers"]
  spec.summary = "Durable idempotency records in PostgreSQL for background jobs delivered at least once: " \
                 "Sidekiq, ActiveJob (any adapter), plain Ruby, and Celery/Python"
  spec.description = "Claims each business operation (order number, payment id) atomically in " \
                     "PostgreSQL before a job runs, so retries, re-enqueues and restarts do not " \
                     "repeat its effect; a stale claim's fate is a policy you choose. Doors for " \
                     "Sidekiq, ActiveJob on any adapter (Sidekiq, Solid Queue, GoodJob, Delayed Job, " \
                     "…), plain Ruby around any consumer (SQS, webhooks), and a Python package " \
                     "with a Celery door over the same table. Rust core (tokio-postgres, deadpool)."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"

  spec.files = Dir[
    "lib/**/*.rb", "lib/idempotent_job/web/views/*.erb",
    "ext/idempotent_job/{Cargo.toml,extconf.rb}", "ext/idempotent_job/src/**/*.rs",
    "crates/core/{Cargo.toml,build.rs}", "crates/core/src/**/*.rs",
    # The Python extension crate and the Rust door are workspace members: cargo reads
    # their manifests (and sources) to load the workspace, but the gem's build never
    # compiles them.
    "python/Cargo.toml", "python/src/**/*.rs", "crates/rust/Cargo.toml", "crates/rust/src/**/*.rs",
    "migrations/*.sql", "Cargo.toml", "Cargo.lock", "README.md", "LICENSE"
  ]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/idempotent_job/extconf.rb"]
  # This source gem builds the extension when installed (the platform gems need neither).
  spec.requirements = ["Rust 1.92 or later (cargo, rustc) and libclang, to build the native extension"]

  # No runtime dependency: each queue door checks its own library when it is required
  # (IdempotentJob::Dependency: Sidekiq 6.4 to 8.x, ActiveJob 6.1 to 8.x) and says which
  # Gemfile line to add, so the ActiveJob door and the plain API pull in no Sidekiq or Redis.
  spec.metadata["rubygems_mfa_required"] = "true"
end
