# frozen_string_literal: true

require "rails/railtie"
require "idempotent_job"

module IdempotentJob
  # Rails integration: `config.idempotent_job.<setting> = value` in the application's
  # configuration (any key of Configuration::SETTINGS; an unknown key raises at boot),
  # config/database.yml's primary database when nothing else names the gem's
  # ({RailsDatabase.fallback}, applied when the store is first built), and the rake
  # tasks (`rake idempotent_job:migrate`, …), which run after the app's environment is
  # loaded.
  class Railtie < ::Rails::Railtie
    config.idempotent_job = ActiveSupport::OrderedOptions.new

    initializer "idempotent_job.configure" do |app|
      settings = app.config.idempotent_job.to_h
      IdempotentJob.configure(**settings) unless settings.empty?
      StoreLifecycle.database_fallback = RailsDatabase.method(:fallback)
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
