# frozen_string_literal: true

# Loads the compiled extension (IdempotentJob::Native), from the first of:
# 1. the platform gem's precompiled copy for this Ruby's ABI, next to this file:
#    idempotent_job/<major.minor>/idempotent_job.<DLEXT> (`rake native:gem` puts it there);
# 2. the copy built when the source gem was installed (ext/idempotent_job/extconf.rb), which
#    RubyGems puts in the gem's extension directory on the load path, or the one `rake
#    compile` puts in lib/ of a checkout: idempotent_job/idempotent_job.<DLEXT>.
# Raises LoadError saying what was tried and what to do when neither loads.
# The extension maps its errors to the exception classes of errors.rb, which it looks up
# once as it loads: they are defined first.
require_relative "errors"
require_relative "gem_platform"

begin
  require_relative "#{RUBY_VERSION[/\A\d+\.\d+/]}/idempotent_job"
rescue LoadError => e
  precompiled = e
  begin
    # `require`, not `require_relative`: the install-time build is not beside this file.
    require "idempotent_job/idempotent_job"
  rescue LoadError => built
    raise LoadError, "idempotent_job's native extension could not be loaded (precompiled for Ruby " \
                     "#{RUBY_VERSION[/\A\d+\.\d+/]}: #{precompiled.message}; built at install: #{built.message}): " \
                     "in a checkout run `rake compile`; otherwise reinstall the gem, either the source gem " \
                     "(needs Rust and libclang) or the platform gem for #{IdempotentJob.gem_platform} if one is " \
                     "published"
  end
end
