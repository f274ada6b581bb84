# frozen_string_literal: true

require "active_record"
require "delayed_job"
require "delayed_job_active_record"

# Delayed Job on the suite's PostgreSQL: its table as the delayed_job_active_record
# generator's migration creates it (created here, the suite has no migrations).
module DelayedJobSetup
  class << self
    # Creates delayed_jobs if it is missing (ActiveRecord must be connected).
    # @return [void]
    def create_table!
      return if ActiveRecord::Base.connection.table_exists?(:delayed_jobs)

      ActiveRecord::Schema.verbose = false
      ActiveRecord::Schema.define do
        create_table :delayed_jobs do |table|
          table.integer :priority, default: 0, null: false
          table.integer :attempts, default: 0, null: false
          table.text :handler, null: false
          table.text :last_error
          table.datetime :run_at
          table.datetime :locked_at
          table.datetime :failed_at
          table.string :locked_by
          table.string :queue
          table.timestamps null: true
        end
        add_index :delayed_jobs, %i[priority run_at], name: "delayed_jobs_priority"
      end
    end

    # @return [void]
    def clear!
      Delayed::Job.delete_all
    end
  end
end
