# frozen_string_literal: true

require "spec_helper"
require "json"
require "fileutils"
require "open3"
require_relative "../support/web_records"

# `mount IdempotentJob::Web => "/idempotency"` in a minimal Rails app (Debian's railties),
# run in its own process: Rails' cookie session carries the page's CSRF token.
RSpec.describe "IdempotentJob::Web mounted in Rails routes", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:job_type) { web_job_type("RailsMountJob") }

  let(:script) do
    <<~RUBY
      require "rails"
      require "action_controller/railtie"
      require "json"
      require "idempotent_job/web"

      class MountApp < Rails::Application
        config.root = Dir.pwd
        config.eager_load = false
        config.logger = Logger.new(File::NULL)
        config.secret_key_base = "k" * 64
        config.hosts.clear
        config.idempotent_job.database_url = ENV.fetch("SPEC_DATABASE_URL")
      end
      Rails.application.initialize!
      Rails.application.routes.draw { mount IdempotentJob::Web => "/idempotency" }

      app = Rails.application
      job_type = ENV.fetch("SPEC_JOB_TYPE")
      page = Rack::MockRequest.new(app).get("/idempotency/confirm", params: { job_type:, operation_key: "7", as: "done" })
      cookie = page["set-cookie"].to_s.split(";").first
      token = page.body[/name="authenticity_token" value="([^"]+)"/, 1]
      form = { job_type:, operation_key: "7", as: "done" }
      refused = Rack::MockRequest.new(app).post("/idempotency/resolve", "HTTP_COOKIE" => cookie, params: form)
      held = IdempotentJob.record(job_type, "7").status
      done = Rack::MockRequest.new(app).post("/idempotency/resolve", "HTTP_COOKIE" => cookie,
                                             params: form.merge(authenticity_token: token))
      puts JSON.generate(page: page.status, token: !token.nil?, refused: refused.status, held:,
                         done: done.status, location: done["location"],
                         status: IdempotentJob.record(job_type, "7").status)
    RUBY
  end

  it "confirms, refuses a POST without the token, and resolves with it" do
    web_stopped(job_type, "7")
    FileUtils.mkdir_p(File.join(root, "tmp"))
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), "RAILS_ENV" => "development",
                                    "SPEC_DATABASE_URL" => SpecServices.database_url, "SPEC_JOB_TYPE" => job_type },
                                  RbConfig.ruby, "-e", script, chdir: File.join(root, "tmp"))
    expect(status).to be_success, out
    result = JSON.parse(out.lines.last)
    expect(result).to eq("page" => 200, "token" => true, "refused" => 403, "held" => "held", "done" => 302,
                         "location" => "/idempotency/record?job_type=#{job_type}&operation_key=7&resolved=done",
                         "status" => "completed")
  end
end
