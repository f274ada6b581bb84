# frozen_string_literal: true

require "rails/railtie"
require "idempotent_job"

module IdempotentJob
  # Rails integration: loads the rake tasks (`rake idempotent_job:migrate`).
  class Railtie < ::Rails::Railtie
    rake_tasks { load File.expand_path("rake_tasks.rb", __dir__) }
  end
end
