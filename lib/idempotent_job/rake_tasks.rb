# frozen_string_literal: true

require "rake"

# Rake tasks of the gem. In a plain Rakefile: `require "idempotent_job/rake_tasks"`;
# in Rails the Railtie loads them. Connection settings come from the environment
# (IDEMPOTENT_JOB_DATABASE_URL, then DATABASE_URL) unless the app configured the gem.
# The native library is loaded only when a task runs, not when the Rakefile is read.
namespace :idempotent_job do
  desc "Create or update the idempotency record table (applies migrations/ in order; safe to run twice)"
  task migrate: (Rake::Task.task_defined?(:environment) ? [:environment] : []) do
    require "idempotent_job"
    applied = IdempotentJob.migrate!
    if applied.empty?
      puts "idempotent_job: schema is up to date"
    else
      applied.each { |name| puts "idempotent_job: applied #{name}" }
    end
  end

  desc "Print the schema SQL of every migration (for teams that manage migrations themselves)"
  task :sql do
    require "idempotent_job"
    puts IdempotentJob.schema_sql
  end
end
