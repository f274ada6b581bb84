# frozen_string_literal: true

# Loaded by the real `sidekiq` process of the ActiveJob specs: the suite's Sidekiq
# boot (gem, middleware, poll interval) plus the ActiveJob spec jobs on ActiveJob's
# :sidekiq adapter.
require_relative "sidekiq_boot"
require_relative "active_job_jobs"

ActiveRecord::Base.establish_connection(SpecServices.database_url)
ActiveJob::Base.queue_adapter = :sidekiq
