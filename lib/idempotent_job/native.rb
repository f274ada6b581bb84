# frozen_string_literal: true

# Loads the compiled extension (IdempotentJob::Native). Installed gems have it on the
# load path as idempotent_job/idempotent_job.so; a checkout gets it from `rake compile`.
begin
  require "idempotent_job/idempotent_job"
rescue LoadError => e
  raise LoadError, "idempotent_job's native extension is not built (#{e.message}); " \
                   "run `rake compile` in a checkout, or reinstall the gem"
end
