# frozen_string_literal: true

require "rails/railtie"
require "idempotent_job"

module IdempotentJob
  # Rails integration: `config.idempotent_job.<setting> = value` in the application's
  # configuration (any key of Configuration::SETTINGS; an unknown key raises at boot),
  # config/database.yml's primary database when nothing else names the gem's
  # ({RailsDatabase.fallback}, applied when the store is first built), and the rake
  # tasks (`rake idempotent_job:migrate`, …), which run after the app's environment is
  # loaded. In an app that loads a supported Sidekiq, the Railtie installs the Sidekiq
  # door (`require "idempotent_job/sidekiq"` is then optional): a job's
  # `sidekiq_options idempotency_key:` is never left an inert option because a require
  # was forgotten.
  class Railtie < ::Rails::Railtie
    config.idempotent_job = ActiveSupport::OrderedOptions.new

    initializer "idempotent_job.configure" do |app|
      settings = app.config.idempotent_job.to_h
      IdempotentJob.configure(**settings) unless settings.empty?
      StoreLifecycle.database_fallback = RailsDatabase.method(:fallback)
    end

    # Runs once the app is initialized: after the Gemfile's gems (Bundler.require, whatever
    # their order) and config/initializers (a Sidekiq required there, `require: false` in
    # the Gemfile), before Sidekiq's server starts fetching jobs. A require of its own is a
    # no-op after it. A loaded Sidekiq outside the door's versions is said once at boot
    # (the door cannot be installed, so a job's `idempotency_key` would be an inert option).
    config.after_initialize do
      library = Dependency::SIDEKIQ
      if Dependency.loaded?(library)
        require library.door
      elsif (version = Dependency.loaded_version(library))
        IdempotentJob.logger.warn(
          "idempotent_job: #{library.label} #{version} is loaded, but the Sidekiq door needs " \
          "#{library.label} #{library.requirement} and is not installed: a job's sidekiq_options " \
          "idempotency_key is not read and its duplicates run; add `#{library.gemfile_line}` to your Gemfile"
        )
      end
    end

    rake_tasks do
      load File.expand_path("rake_tasks.rb", __dir__)
      # Rails defines :environment after the railties' task blocks: add it now, so the
      # tasks run with the app's initializers (and its IdempotentJob.configure).
      %w[migrate purge repeats held resolve].each do |name|
        Rake::Task["idempotent_job:#{name}"].enhance([:environment])
      end
    end
  end
end
