# frozen_string_literal: true

# An app without Sidekiq (run by spec/integration/optional_dependencies_spec.rb as
# `ruby -r spec/support/hide_sidekiq.rb spec/support/no_sidekiq_app.rb`): the ActiveJob
# door on Delayed Job, the plain API, the rake tasks and the web page (with /metrics),
# each printing one "ok: …" line. Against DATABASE_URL.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "stringio"
require "idempotent_job"
require "idempotent_job/active_job"
require "idempotent_job/web"
require "idempotent_job/rake_tasks"
require "idempotent_job/testing"
require_relative "services"
require_relative "effects"
require_relative "delayed_job_setup"

begin
  require "idempotent_job/sidekiq"
  puts "the Sidekiq door loaded without Sidekiq"
rescue IdempotentJob::DependencyError => e
  puts "sidekiq door: #{e.message}"
end

ActiveRecord::Base.establish_connection(SpecServices.active_record_url)
ActiveJob::Base.logger = Logger.new(File::NULL)
ActiveJob::Base.queue_adapter = :delayed_job
Delayed::Worker.logger = Logger.new(File::NULL)
IdempotentJob.configure(database_url: SpecServices.database_url, logger: Logger.new(File::NULL))
IdempotentJob.migrate!
DelayedJobSetup.create_table!
Effects.create_table!

# The app's job.
class NoSidekiqChargeJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, on_enqueue: :skip_completed

  def perform(order_id) = Effects.record("NoSidekiqChargeJob", order_id)
end

order = "no-sidekiq-#{Process.pid}-#{rand(1 << 30)}"
2.times { NoSidekiqChargeJob.perform_later(order) } # a duplicate enqueue: both queued, not yet completed
Delayed::Worker.new(quiet: true).work_off
runs = Effects.connection.exec_params("SELECT count(*) FROM spec_effects WHERE operation = $1", [order]).getvalue(0, 0)
status = IdempotentJob.record("NoSidekiqChargeJob", order).status
puts "ok: active_job on delayed_job: #{runs} run, record #{status}"
puts "ok: active_job enqueue of the completed operation: #{NoSidekiqChargeJob.perform_later(order).inspect}"

plain = 2.times.map { IdempotentJob.perform_once("NoSidekiqPlain", order) { :done }.decision }
puts "ok: plain #{plain.join(", ")}"

out = StringIO.new
$stdout = out
Rake::Task["idempotent_job:held"].invoke
$stdout = STDOUT
puts "ok: rake #{out.string.lines.last.strip}"

env = { "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "QUERY_STRING" => "", "rack.input" => StringIO.new }
page, = IdempotentJob::Web.call(env.merge("PATH_INFO" => "/"))
metrics, _, body = IdempotentJob::Web.call(env.merge("PATH_INFO" => "/metrics"))
completed = %(idempotent_job_records{job_type="NoSidekiqChargeJob",status="completed"})
line = body.join.lines.find { |l| l.start_with?(completed) }
puts "ok: web #{page}, metrics #{metrics}: #{line&.strip}"

loaded = $LOADED_FEATURES.grep(%r{/gems/(sidekiq|redis)[^/]*/})
puts "ok: loaded from sidekiq or redis gems: #{loaded.size}, Sidekiq constant: #{defined?(Sidekiq).inspect}"
