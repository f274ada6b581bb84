# frozen_string_literal: true

require "rails/railtie"
require "idempotent_job"

module IdempotentJob
  # Rails integration: loads the rake tasks (`rake idempotent_job:migrate`).
  class Railtie < ::Rails::Railtie
    rake_tasks do
      load File.expand_path("rake_tasks.rb", __dir__)
      # Rails defines :environment after the railties' task blocks: add it now, so the
      # tasks run with the app's initializers (and its IdempotentJob.configure).
      %w[migrate purge held resolve].each { |name| Rake::Task["idempotent_job:#{name}"].enhance([:environment]) }
    end
  end
end
