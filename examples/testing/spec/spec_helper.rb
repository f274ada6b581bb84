# frozen_string_literal: true

require "active_record"
require "sidekiq/testing"
require "idempotent_job/sidekiq"
require "idempotent_job/testing"

# DATABASE_URL, or a throwaway PostgreSQL started for this run (stopped at exit).
database_url = IdempotentJob::Testing.setup!
ActiveRecord::Base.establish_connection(database_url)
ActiveRecord::Migration.verbose = false
ActiveRecord::Schema.define do
  create_table :charges, if_not_exists: true do |t|
    t.integer :order_id, null: false
    t.integer :amount_cents
  end
  create_table :refunds, if_not_exists: true do |t|
    t.string :refund_id, null: false
    t.integer :amount_cents
  end
end

Dir[File.expand_path("../app/**/*.rb", __dir__)].each { |file| require file }

RSpec.configure do |config|
  config.before do
    IdempotentJob::Testing.clean_records!
    Charge.delete_all
    Refund.delete_all
  end
end
